"""What the watched paths cover: the packages they may enter, the features speculators never turns on, the roles
and their classes per platform, and each contract's entry points."""

from __future__ import annotations

#: The packages whose code the watched paths may enter (calls out of them are leaves).
PACKAGES = ("vllm/v1/engine", "vllm/v1/worker", "vllm/v1/core", "vllm/v1/executor", "vllm/v1/request.py")
#: Text in an `if` test for a feature speculators' generator never enables (it builds its own VllmConfig):
#: the branch taken with it on is not followed.
NEVER_ENABLED = (
    "kv_transfer_config",
    "ec_transfer_config",
    "lora_config",
    "speculative_config",
    "is_pooling_model",
    "kv_connector",
    "VLLM_ELASTIC_EP",
    "is_elastic_ep",
    "dcp_world_size",
    "pcp_world_size",
    "use_ubatching",
    "supports_mm_inputs",
    "is_multimodal",
    "structured_output",
    "pooling",
    "enable_return_routed_experts",
    "is_encoder_decoder",
    "has_encoder",
    "sleep_mode",
    "is_sleeping",
    "data_parallel",
)
#: Attribute names whose class is a role, resolved per platform.
ROLES = {
    "model_executor": "executor",
    "executor": "executor",
    "model_runner": "runner",
    "worker": "worker",
    "driver_worker": "worker",
    "scheduler": "scheduler",
}
ENGINE = "vllm.v1.engine.core.EngineCore"
SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"
EXECUTORS = (
    "vllm.v1.executor.multiproc_executor.MultiprocExecutor",
    "vllm.v1.executor.uniproc_executor.UniProcExecutor",
)
#: Platform -> its worker module and class (the runners come from what that worker builds by default).
PLATFORMS = {"cuda": ("vllm.v1.worker.gpu_worker", "Worker"), "cpu": ("vllm.v1.worker.cpu_worker", "CPUWorker")}
#: Contract -> its entry points, (role, method), and the roles whose code its path enters. A call into another
#: role's method is a step of the path (a leaf: listed, not compared): the set-up path names the worker methods
#: EngineCore has the executor run (speculators replays or skips them: C-kvlayout's check), while their insides
#: are the worker paths'. Module functions are followed in the modules of the entered roles' classes (helpers
#: written for them); a library module's function (vllm.v1.core.kv_cache_planning, which speculators calls itself
#: and whose imports and signatures C-kvhelpers checks) is a leaf.
WATCH: dict[str, tuple[tuple[tuple[str, str], ...], frozenset[str]]] = {
    "kvlayout": ((("engine", "__init__"), ("engine", "_initialize_kv_caches")), frozenset({"engine", "executor"})),
    "runtime": (
        (
            ("worker", "__init__"),
            ("worker", "init_device"),
            ("worker", "load_model"),
            ("worker", "initialize_from_config"),
            ("worker", "compile_or_warm_up_model"),
            ("runner", "__init__"),
            ("runner", "load_model"),
            ("runner", "initialize_kv_cache"),
        ),
        frozenset({"worker", "runner"}),
    ),
    "twophase": ((("worker", "execute_model"), ("worker", "sample_tokens")), frozenset({"worker", "runner"})),
    "chunkedprefill": (
        (
            ("scheduler", "schedule"),
            ("runner", "_update_states"),
            ("runner", "prepare_inputs"),
            ("runner", "_prepare_inputs"),
        ),
        frozenset({"scheduler", "runner", "batch"}),
    ),
}
KIND = "changed-unclassified"
