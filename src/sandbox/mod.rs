//! Confinement of toolbox children.

pub mod landlock;
