"""The client axis: speculators releases after 0.3.0, each driven as its users run it, against ours.

The harness's own path is speculators 0.3.0's in-process generator through the shims (`harness.runtime`). Later
releases extract differently, and each is checked on the tiny models against that path:

* 0.4.0 ported the shims' fixes into its own in-process generator: `second_client` runs it unshimmed in a child
  interpreter, on the vLLM range it declares.
* 0.5.0 on moved to vLLM's native export (`harness.native`) served by `vllm serve`: `server` starts the server as
  speculators' launcher does, `vllm_client` loads each release's client from its wheel and calls it, `contracts`
  holds the server path's own rows (`client-*`), `server_check` is the same comparison as a standalone command (the
  GPU tier's), and `declared` what each release's wheel declares (its hs-connectors pin and reader). The releases
  and models driven are harness.subjects.releases; the wheels are unpacked by harness.envs.wheels; what
  hs-connectors uses of vLLM is harness.installed.connectors_surface.

suites/clients/ runs them; `harness.reporting.client_axis` turns their rows into the answer table.
"""
