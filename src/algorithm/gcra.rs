//! gcra (placeholder until implemented).
