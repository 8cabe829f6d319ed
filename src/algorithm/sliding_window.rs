//! sliding_window (placeholder until implemented).
