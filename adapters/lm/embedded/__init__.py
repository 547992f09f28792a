"""The embedded GPT-2's fast CPU path: its forward in a few operations per block
(``lean_gpt2``), the rollout compiled by Numba (``compiled_rollout``: ``rollout_kernels``' columns
over ``compiled_gpt2``'s forward, the weights packed by ``weights``), and the rescoring's forward
and backward as compiled functions (``compiled_rescoring``, with ``prompt_attention``,
``tanh_gelu``, ``vector_exp`` and ``gemm``). Transformers' forward, through
``adapters.lm.policy``, is the reference each is held to."""
