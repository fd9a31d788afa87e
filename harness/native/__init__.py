"""vLLM's own hidden-state export (vLLM >= 0.17), run on a tiny model as a cross-check of ours.

From vLLM 0.17 a user need not patch vLLM at all to get hidden states: the speculative-decoding
method `extract_hidden_states` stacks the target's EAGLE-3 auxiliary hidden states and the KV
connector `ExampleHiddenStatesConnector` writes them, per request, to
`<shared_storage_path>/<request id>.safetensors` (tensors `hidden_states` [tokens, layers, hidden]
and `token_ids`), returning the file in `kv_transfer_params["hidden_states_path"]`. speculators
moved to that path in 0.5.0. If both paths agree on the tiny models, ours is right twice over; if
they do not, one of them is wrong, and the report says where.

The two paths number layers differently, and confusing them gives numbers that look plausible
and are one whole decoder layer off:

* speculators' in-process id k is the OUTPUT of decoder layer k (hidden_states + residual after it);
* vLLM's native id k is the INPUT of decoder layer k, i.e. the output of layer k - 1; id 0 is the
  embeddings and id n (n = number of layers) is the last layer's output, before the final norm.

`map_layer_ids` is the one place that shift lives. Everything else here is vLLM's own public
path (`LLM(...)`, `SamplingParams(max_tokens=1)`, the files it writes), driven as its offline
example drives it, so a failure is vLLM's behaviour and not a harness artefact. Availability is
decided by probing what this vLLM has (the speculative-method literal, the connector registry),
never by its version string.

Environment: the caller sets what every vLLM start here needs (the pytest plugin does:
VLLM_CPU_KVCACHE_SPACE, HF_HUB_OFFLINE, spawned workers). MLA models go through
`harness.contracts.mla.prepare`, the same decision the shared generator made, so both paths run the
same attention.
"""

from harness.native.engine import (
    CONNECTOR,
    METHOD,
    NativeExporter,
    NativeExportError,
    default_gpu_memory_utilization,
    engine_kwargs,
    kv_transfer_config,
    run_native_export,
    speculative_config,
)
from harness.native.engine_log import platform_failure, root_cause
from harness.native.files import NativeExport, read_export
from harness.native.layer_ids import NATIVE_SHIFT, map_layer_ids
from harness.native.probes import (
    availability,
    connector_writes_lock_files,
    probe_chunked_prefill,
    probe_config,
    probe_connector,
    probe_method,
    probe_supports_eagle3,
    speculative_methods,
)
from harness.native.rows import (
    CONFIG_CONTRACT,
    CONTRACT,
    EAGLE3_CONTRACT,
    FILES_CONTRACT,
    PATH_CONTRACT,
    PER_MODEL_CONTRACTS,
    NativeProbe,
    observe,
    observe_path,
    probe_layout,
    probe_path_returned,
    probe_run,
    probe_write_protocol,
)

__all__ = [
    "CONFIG_CONTRACT",
    "CONNECTOR",
    "CONTRACT",
    "EAGLE3_CONTRACT",
    "FILES_CONTRACT",
    "METHOD",
    "NATIVE_SHIFT",
    "NativeExport",
    "NativeExportError",
    "NativeExporter",
    "NativeProbe",
    "PATH_CONTRACT",
    "PER_MODEL_CONTRACTS",
    "availability",
    "connector_writes_lock_files",
    "default_gpu_memory_utilization",
    "engine_kwargs",
    "kv_transfer_config",
    "map_layer_ids",
    "observe",
    "observe_path",
    "platform_failure",
    "probe_chunked_prefill",
    "probe_config",
    "probe_connector",
    "probe_layout",
    "probe_method",
    "probe_path_returned",
    "probe_run",
    "probe_supports_eagle3",
    "probe_write_protocol",
    "read_export",
    "root_cause",
    "run_native_export",
    "speculative_config",
    "speculative_methods",
]
