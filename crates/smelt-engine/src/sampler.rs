//! Turning logits into the next token (filled in by the sampler work).
