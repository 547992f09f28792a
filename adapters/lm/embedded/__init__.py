"""The embedded GPT-2's fast CPU path: its forward in a few operations per block
(``lean_gpt2``), the rollout as one compiled loop (``compiled_rollout`` over ``compiled_gpt2``) or
one ONNX Runtime call per column where a grammar matcher runs on the host (``onnx_rollout``,
``onnx_graph``, ``onnx_builder``), and the rescoring's forward and backward as compiled functions
(``compiled_rescoring``, with ``prompt_attention``, ``tanh_gelu``, ``vector_exp`` and ``gemm``).
Transformers' forward, through ``adapters.lm.policy``, is the reference each is held to."""
