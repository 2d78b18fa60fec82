//! The person's part in a toolbox's calls (DESIGN §3; docs/manifest.md,
//! "Asking the person"): which calls wait for a person's yes (`confirm`),
//! how long a question waits for its answer (`ask_timeout_s`), and whether
//! the child may ask the person questions itself (`elicitation`).

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// Which calls of a toolbox wait for a person's yes before the child sees them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Confirm {
    /// None (the default).
    #[default]
    None,
    /// Those of tools whose annotations say `destructiveHint: true` (the
    /// child's, or the manifest's `[annotations.<tool>]`).
    Destructive,
    /// Every call.
    All,
    /// Those of the tools these names match (`*` any run of characters,
    /// `?` one character).
    Tools(Vec<String>),
}

impl Confirm {
    /// Whether a call of tool `name` waits for a yes; `destructive` says
    /// whether the tool is annotated so (asked only under `destructive`).
    pub fn needs(&self, name: &str, destructive: impl FnOnce() -> bool) -> bool {
        match self {
            Confirm::None => false,
            Confirm::Destructive => destructive(),
            Confirm::All => true,
            Confirm::Tools(globs) => globs.iter().any(|g| glob_matches(g, name)),
        }
    }

    /// Why the value cannot be used, if it cannot.
    pub(super) fn check(&self) -> Result<(), String> {
        let Confirm::Tools(globs) = self else {
            return Ok(());
        };
        if globs.is_empty() {
            return Err("confirm = [] names no tool; write confirm = \"none\" for none".into());
        }
        for glob in globs {
            if glob.is_empty() || glob.len() > 128 || glob.chars().any(char::is_control) {
                return Err(format!(
                    "confirm lists {glob:?}, which is no tool name: give names or globs of at \
                     most 128 characters (`*` any run, `?` one character)"
                ));
            }
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for Confirm {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Words;
        impl<'de> Visitor<'de> for Words {
            type Value = Confirm;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"none\", \"destructive\", \"all\" or a list of tool names")
            }
            fn visit_str<E: de::Error>(self, word: &str) -> Result<Confirm, E> {
                match word {
                    "none" => Ok(Confirm::None),
                    "destructive" => Ok(Confirm::Destructive),
                    "all" => Ok(Confirm::All),
                    other => Err(E::custom(format!(
                        "confirm = {other:?}: write \"none\", \"destructive\", \"all\" or a list \
                         of tool names"
                    ))),
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Confirm, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    names.push(name);
                }
                Ok(Confirm::Tools(names))
            }
        }
        deserializer.deserialize_any(Words)
    }
}

/// Whether `name` matches `glob`: `*` any run of characters (none
/// included), `?` exactly one, anything else itself.
pub fn glob_matches(glob: &str, name: &str) -> bool {
    let (glob, name): (Vec<char>, Vec<char>) = (glob.chars().collect(), name.chars().collect());
    // The classic two-pointer match, with the last `*` to fall back to:
    // linear in practice, never exponential.
    let (mut g, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if g < glob.len() && (glob[g] == '?' || glob[g] == name[n]) {
            g += 1;
            n += 1;
        } else if g < glob.len() && glob[g] == '*' {
            star = Some((g, n));
            g += 1;
        } else if let Some((sg, sn)) = star {
            g = sg + 1;
            n = sn + 1;
            star = Some((sg, sn + 1));
        } else {
            return false;
        }
    }
    glob[g..].iter().all(|&c| c == '*')
}

/// The longest a question may wait for the person, seconds.
pub const MAX_ASK_TIMEOUT_S: u64 = 600;

/// How a toolbox's calls involve the person, as its manifest says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asking {
    /// Which calls wait for a yes.
    pub confirm: Confirm,
    /// How long a confirmation or a child's question waits for its answer:
    /// its own deadline, not the call's (a person takes seconds).
    pub ask_timeout_s: u64,
    /// Whether the child may ask the person questions (MCP
    /// `elicitation/create`): declared to it only then.
    pub elicitation: bool,
}

impl Default for Asking {
    fn default() -> Self {
        Asking {
            confirm: Confirm::None,
            ask_timeout_s: 30,
            elicitation: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_names_as_a_shell_would() {
        for (glob, name, matches) in [
            ("unlock_*", "unlock_door", true),
            ("unlock_*", "lock_door", false),
            ("*", "anything", true),
            ("delete_?", "delete_a", true),
            ("delete_?", "delete_ab", false),
            ("*_file*", "write_file_now", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
        ] {
            assert_eq!(glob_matches(glob, name), matches, "{glob} {name}");
        }
        // A hostile pattern stays linear.
        let started = std::time::Instant::now();
        assert!(!glob_matches(
            &format!("{}b", "*a".repeat(60)),
            &"a".repeat(10_000)
        ));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn confirm_reads_each_form_and_says_what_is_wrong() {
        #[derive(Deserialize)]
        struct T {
            confirm: Confirm,
        }
        let read = |text: &str| toml::from_str::<T>(text).map(|t| t.confirm);
        assert_eq!(read("confirm = \"none\"").unwrap(), Confirm::None);
        assert_eq!(
            read("confirm = \"destructive\"").unwrap(),
            Confirm::Destructive
        );
        assert_eq!(read("confirm = \"all\"").unwrap(), Confirm::All);
        assert_eq!(
            read("confirm = [\"unlock_*\"]").unwrap(),
            Confirm::Tools(vec!["unlock_*".into()])
        );
        let e = read("confirm = \"yes\"").unwrap_err();
        assert!(
            e.message().contains("\"none\", \"destructive\", \"all\""),
            "{e}"
        );
        assert!(read("confirm = 3").is_err());
        assert!(Confirm::Tools(vec![]).check().is_err());
        assert!(Confirm::Tools(vec!["".into()]).check().is_err());
        let destructive = Confirm::Destructive;
        assert!(destructive.needs("rm", || true) && !destructive.needs("ls", || false));
        let listed = Confirm::Tools(vec!["unlock_*".into()]);
        assert!(listed.needs("unlock_door", || false) && !listed.needs("lock_door", || true));
    }
}
