//! sliding_log (placeholder until implemented).
