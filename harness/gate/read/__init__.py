"""Step 2 of the gate: what each side shows, as facts owned by contracts: the used and shim surfaces fact by fact
(`static`, owners from `coverage`), the contracts' own source checks (`contract_checks`), the code each contract
watches followed through calls (`reach`), the server path's needs (`client`), a CPU env's observed run (`dynamic`)."""
