"""Helpers every layer may use and that know nothing of vLLM: where data and outputs live (`paths`), child
processes and their cleanup (`processes`), file descriptors (`fdio`), progress lines (`progress`), worker pools
(`parallel`) and the CLI's fixed texts (`cli_text`)."""
