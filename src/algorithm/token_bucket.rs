//! token_bucket (placeholder until implemented).
