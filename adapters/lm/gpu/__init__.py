"""The rollout on a GPU: a static KV cache in fixed batch buckets, replayed as CUDA graphs
(``static_decode`` its step loop, ``static_decoder`` one bucket's cache, buffers and graphs); on a
CPU the same code runs without graphs, which is how its tests hold it to the eager rollout."""
