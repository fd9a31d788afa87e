"""What is installed, read rather than assumed: the versions of vLLM, speculators, torch and the platform
(`versions`), and the vLLM surface speculators uses, parsed from its installed source (`surface`)."""
