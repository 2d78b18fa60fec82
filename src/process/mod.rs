//! One child process and what it runs in, from the outside in: the process
//! itself and its stdio ([`child`]), its confinement ([`sandbox`]), its
//! cgroup ([`cgroup`]), the keeper that makes everything a toolbox started
//! die with the daemon ([`keeper`]), and what a toolbox's process trees use
//! ([`proctree`]).

pub mod cgroup;
pub mod child;
pub mod keeper;
pub mod proctree;
pub mod sandbox;
