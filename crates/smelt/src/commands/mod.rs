//! One module per subcommand.

pub mod inspect;
pub mod quantize;
pub mod serve;
pub mod synth;
