"""What users import: speculators' generator made to run on the installed vLLM (`generator`), the
namespace rebinding it runs through, the executor view and worker extension that apply the shims, and the
way captured states travel from the workers (`transport`)."""
