//! fixed_window (placeholder until implemented).
