//! Confinement of toolbox children (the "standard" sandbox profile).

pub mod seccomp;
