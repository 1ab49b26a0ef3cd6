//! Detecting: what a request is (its fingerprint and, in near mode, its
//! similarity signature) and what its conversation shows (tool-call
//! loops). Pure functions of the request; nothing here keeps state.

pub mod fingerprint;
pub mod mcp;
pub mod news;
pub mod progress;
pub mod repetition;
pub mod results;
pub mod similarity;
pub mod tool_loops;
pub mod verdict;
