"""What is installed, read rather than assumed: the versions of vLLM, speculators, torch and the platform
(`versions`), the vLLM surface speculators uses and the one hs-connectors uses, parsed from installed or released
source (`surface`, `connectors_surface`), and how the installed runner orders a step's rows (`row_order`)."""
