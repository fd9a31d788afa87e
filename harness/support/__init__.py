"""Helpers every layer may use and that know nothing of vLLM: where data and outputs live (`paths`), child
processes and their cleanup (`processes`), file descriptors (`fdio`), progress lines (`progress`), worker pools
(`parallel`), the CLI's fixed texts (`cli_text`), shared memory left by dead processes (`shm_orphans`), running a
function's code against another module namespace (`namespace`), the run-to-run tokens taken out of quoted errors
(`volatile`), and how a report file is written (`report_files`)."""
