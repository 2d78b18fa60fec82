//! The commands that are not the daemon: [`check`] (`toolboxd check`),
//! [`caller`] (`toolboxd list`, `toolboxd call`), [`scaffold`]
//! (`toolboxd new`).

pub mod caller;
pub mod check;
pub mod scaffold;
