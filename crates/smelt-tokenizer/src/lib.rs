//! Tokenizers (SentencePiece/llama, GPT-2 BPE, Gemma) and chat templates from GGUF metadata.
