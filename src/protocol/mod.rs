//! What the protocols fix, with no behaviour of toolboxd's: the bus's
//! topics and their routing, the toolbox id grammar. A leaf: it depends on
//! no other module of the crate.

pub mod ids;
pub mod topics;
