//! `toolboxd new`: writes a working toolbox and its manifest, ready for
//! `toolboxd check --probe`.

use std::path::{Path, PathBuf};

use crate::manifest::valid_id;

/// The standard-library helper every Python toolbox imports.
const PYTHON_HELPER: &str = include_str!("../../examples/python/mcp_toolbox.py");
const PYTHON_TEMPLATE: &str = include_str!("../../templates/python_toolbox.py");
const SHELL_TEMPLATE: &str = include_str!("../../templates/shell_toolbox.sh");

/// The languages `new` writes toolboxes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    Python,
    Shell,
}

/// Why nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    #[error(
        "{0:?} is not a valid toolbox id; use letters, digits, '_' and '-' (never ':' or '.')"
    )]
    BadName(String),
    #[error("{0} already exists; pick another name or remove it")]
    Exists(PathBuf),
    /// (`reason`, not `source`: the reason is said once, in this message,
    /// not again by an error chain.)
    #[error("cannot write {path}: {reason}")]
    Write {
        path: PathBuf,
        reason: std::io::Error,
    },
}

/// Writes `DIR/NAME.toml` and the toolbox in `DIR/NAME/`; returns the files written.
pub fn new_toolbox(name: &str, lang: Lang, dir: &Path) -> Result<Vec<PathBuf>, ScaffoldError> {
    if !valid_id(name) || name.len() > MAX_NAME {
        return Err(ScaffoldError::BadName(name.to_owned()));
    }
    // A first toolbox: its manifests directory is made too.
    std::fs::create_dir_all(dir).map_err(|reason| ScaffoldError::Write {
        path: dir.to_owned(),
        reason,
    })?;
    let manifest = dir.join(format!("{name}.toml"));
    let code_dir = dir.join(name);
    for path in [&manifest, &code_dir] {
        // symlink_metadata: a dangling symlink counts as existing (it would
        // otherwise be written through, outside DIR).
        if std::fs::symlink_metadata(path).is_ok() {
            return Err(ScaffoldError::Exists(path.clone()));
        }
    }
    let written = write_toolbox(name, lang, &manifest, &code_dir);
    if written.is_err() {
        // Leave nothing half-made that would block the retry.
        let _ = std::fs::remove_file(&manifest);
        let _ = std::fs::remove_dir_all(&code_dir);
    }
    written
}

/// The longest name `new` takes (its files must fit a file name).
const MAX_NAME: usize = 64;

fn write_toolbox(
    name: &str,
    lang: Lang,
    manifest: &Path,
    code_dir: &Path,
) -> Result<Vec<PathBuf>, ScaffoldError> {
    let (script, template, manifest_text) = match lang {
        Lang::Python => (
            format!("{name}.py"),
            PYTHON_TEMPLATE,
            format!(
                "# {name}: a Python toolbox (see docs/authoring.md)\nid = \"{name}\"\n\
                 command = \"python3\"\nargs = [\"{name}/{name}.py\"]\n\
                 env = {{ PYTHONUNBUFFERED = \"1\" }}\n"
            ),
        ),
        Lang::Shell => (
            format!("{name}.sh"),
            SHELL_TEMPLATE,
            format!(
                "# {name}: a bash + jq toolbox (see docs/authoring.md)\nid = \"{name}\"\n\
                 command = \"./{name}/{name}.sh\"\n"
            ),
        ),
    };
    // New toolboxes start closed to the network; opening it is one line.
    let manifest_text = format!(
        "{manifest_text}\n[sandbox]\n\
         # No socket of this toolbox reaches anything (the bus included).\n\
         # To let it call web APIs (TCP ports 80 and 443), write: network = \"internet\"\n\
         # To let it reach everything, the bus and local services too: network = \"full\"\n\
         network = \"none\"\n"
    );
    let mut written = Vec::new();
    let write = |path: PathBuf, text: &str, written: &mut Vec<PathBuf>| {
        use std::io::Write;
        // create_new: never through a symlink, never over a file.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut file| file.write_all(text.as_bytes()))
            .map_err(|reason| ScaffoldError::Write {
                path: path.clone(),
                reason,
            })?;
        written.push(path);
        Ok::<_, ScaffoldError>(())
    };
    std::fs::create_dir(code_dir).map_err(|reason| ScaffoldError::Write {
        path: code_dir.to_owned(),
        reason,
    })?;
    let script_path = code_dir.join(&script);
    write(
        script_path.clone(),
        &template.replace("{{NAME}}", name),
        &mut written,
    )?;
    make_executable(&script_path)?;
    if lang == Lang::Python {
        write(code_dir.join("mcp_toolbox.py"), PYTHON_HELPER, &mut written)?;
    }
    write(manifest.to_owned(), &manifest_text, &mut written)?;
    Ok(written)
}

fn make_executable(path: &Path) -> Result<(), ScaffoldError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(|reason| {
        ScaffoldError::Write {
            path: path.to_owned(),
            reason,
        }
    })
}
