"""The language-model stack: the Hugging Face policy, its rollouts and decoding, grammar masks,
tokens, LoRA, model loading, exact log-probabilities and the value head."""
