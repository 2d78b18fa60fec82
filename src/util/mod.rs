//! Small tools with no knowledge of toolboxd: [`files`] (operator files
//! read without trusting what is at the path), [`throttle`] (a per-second
//! budget for log lines), [`clock`] (wall-clock times, RFC 3339), [`or_never`]
//! (`or_never` for `select!` branches that apply only sometimes),
//! [`deadline`] (a call's one deadline).

pub mod clock;
pub mod deadline;
pub mod files;
pub mod or_never;
pub mod throttle;
