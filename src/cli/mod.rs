//! The commands that are not the daemon: [`check`] (`toolboxd check`),
//! [`bus_request`] (`toolboxd list`, `toolboxd call`), [`scaffold`]
//! (`toolboxd new`).

pub mod bus_request;
pub mod check;
pub mod scaffold;
