"""The gate over many builds: every consecutive pair of releases (`pairs`), the release that changed a contract
(`bisect`), and one-change copies of real releases that judge the gate by the cases it was not written for
(`mutants`)."""
