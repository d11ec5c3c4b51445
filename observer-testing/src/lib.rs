//! What observer's kernel tests and its benchmark share (aya's
//! `test_helpers` pattern): a private network namespace per scenario
//! (`Netns`), the churn generator run inside it (`churn`), the kernel's own
//! counters there (nstat, ss), and scrapes of a running daemon (`http`).
//!
//! Helpers panic with what went wrong rather than return errors, so a
//! failing test points at its own line (as aya's tests do).
pub mod churn;
pub mod http;
pub mod netns;

pub use churn::{ClientReport, Server, churn};
pub use netns::{HoldingClient, Netns};
