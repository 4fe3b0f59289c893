//! Weight quantization: which formats a model's weights can be turned into, and the
//! round-to-nearest quantization of a loaded model's weights (online, at load time).
