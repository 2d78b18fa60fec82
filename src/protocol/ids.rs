//! The toolbox id grammar (OVOS-TOOLS-1 §3; docs/manifest.md): what a
//! manifest may name, and what a per-toolbox topic may carry.

/// Whether `id` is a valid toolbox_id.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
