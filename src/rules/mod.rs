//! Rules: YAML schema, validation, the compiled match index and lookup.
mod model;
pub use model::*;
