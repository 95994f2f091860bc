//! `duet serve --config duet.toml`: a TOML file holding `duet serve` flags
//! as top-level keys (`max-connections = 500`, or `max_connections`), and
//! the effective configuration `getCmdLineOpts` reports.
//!
//! The file is turned into flags placed before the command line's own, and
//! the `serve` command lets a later flag override an earlier one, so a flag
//! given on the command line wins over the file; clap then parses and checks
//! everything once, so the file accepts exactly what the flags accept.
//!
//! Invariants:
//! - a key that is not a `duet serve` flag is refused, naming the key (and
//!   the file); so are tables, arrays and the key `config` itself;
//! - a boolean switch (`auth = true`) becomes `--auth`; `false` leaves it
//!   off (a switch the file turns on cannot be turned off on the command
//!   line: leave it out of the file); a boolean flag that takes a value
//!   (`allow-disk-use-by-default = false`) is passed as its value.

use std::ffi::OsString;
use std::path::Path;
use std::sync::OnceLock;

use bson::{Bson, Document};
use clap::{ArgAction, Args, Command};

use crate::ServeArgs;

/// The `serve` flags as clap knows them (for checking keys).
pub fn serve_command() -> Command {
    ServeArgs::augment_args(Command::new("serve").args_override_self(true))
}

/// The `--config` path among the `serve` arguments, if any.
fn config_path(args: &[OsString]) -> Result<Option<OsString>, String> {
    let mut it = args.iter();
    let mut found = None;
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--" {
            break;
        }
        if s == "--config" {
            found = Some(
                it.next()
                    .cloned()
                    .ok_or("--config needs a file (duet serve --config duet.toml)")?,
            );
        } else if let Some(v) = s.strip_prefix("--config=") {
            found = Some(OsString::from(v));
        }
    }
    Ok(found)
}

/// The flags a configuration file's text stands for.
pub fn file_flags(text: &str, file: &str) -> Result<Vec<OsString>, String> {
    let table: toml::Table = text
        .parse()
        .map_err(|e| format!("{file}: not valid TOML: {e}"))?;
    let command = serve_command();
    let mut out = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && long != "config")
            .ok_or_else(|| {
                format!(
                    "{file}: unknown key '{key}': not a `duet serve` flag (every flag is a key, \
                     e.g. max-connections = 500; see ops/duet.example.toml)"
                )
            })?;
        let switch = matches!(arg.get_action(), ArgAction::SetTrue);
        let text = match value {
            toml::Value::Boolean(b) if switch => {
                if *b {
                    out.push(OsString::from(format!("--{long}")));
                }
                continue;
            }
            _ if switch => {
                return Err(format!(
                    "{file}: key '{key}' is a switch: write {key} = true or false"
                ))
            }
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                return Err(format!(
                    "{file}: key '{key}' must be a string, number or boolean, not {}",
                    other.type_str()
                ))
            }
        };
        out.push(OsString::from(format!("--{long}={text}")));
    }
    Ok(out)
}

static SERVE_ARGV: OnceLock<Vec<OsString>> = OnceLock::new();

/// `argv` of the `duet` process with the flags of `serve --config FILE`
/// spliced in right after `serve` (so the command line's own flags, which
/// follow, override them). Other commands' arguments come back unchanged.
pub fn expand_args(argv: Vec<OsString>) -> Result<Vec<OsString>, String> {
    if argv.get(1).map(|a| a.to_string_lossy() == "serve") != Some(true) {
        return Ok(argv);
    }
    let rest = &argv[2..];
    let mut out = argv[..2].to_vec();
    if let Some(path) = config_path(rest)? {
        let shown = Path::new(&path).display().to_string();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("--config {shown}: cannot read it: {e}"))?;
        out.extend(file_flags(&text, &shown)?);
    }
    out.extend(rest.iter().cloned());
    let _ = SERVE_ARGV.set(out[1..].to_vec());
    Ok(out)
}

fn typed(raw: &str) -> Bson {
    match raw {
        "true" => Bson::Boolean(true),
        "false" => Bson::Boolean(false),
        _ => {
            if let Ok(i) = raw.parse::<i64>() {
                Bson::Int64(i)
            } else if let Ok(f) = raw.parse::<f64>() {
                Bson::Double(f)
            } else {
                Bson::String(raw.to_string())
            }
        }
    }
}

/// Every `serve` flag with the value in force (file, command line or
/// default), by flag name: `getCmdLineOpts`' `parsed`. `argv` starts with
/// `serve`; empty when it does not parse.
pub fn effective(argv: &[OsString]) -> Document {
    let Ok(m) = serve_command().try_get_matches_from(argv) else {
        return Document::new();
    };
    let mut out = Document::new();
    for arg in serve_command().get_arguments() {
        let (Some(long), id) = (arg.get_long(), arg.get_id().as_str()) else {
            continue;
        };
        let Ok(Some(raw)) = m.try_get_raw(id) else {
            continue;
        };
        let vals: Vec<Bson> = raw.map(|v| typed(&v.to_string_lossy())).collect();
        match vals.len() {
            0 => {}
            1 => {
                out.insert(long, vals.into_iter().next().unwrap_or(Bson::Null));
            }
            _ => {
                out.insert(long, vals);
            }
        }
    }
    out
}

/// The effective `serve` configuration of this process (after
/// [`expand_args`]); empty when the server was not started by `duet serve`.
pub fn effective_of_process() -> Document {
    SERVE_ARGV.get().map(|a| effective(a)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn parse(argv: &[OsString]) -> ServeArgs {
        use clap::FromArgMatches;
        let m = serve_command()
            .try_get_matches_from(argv)
            .expect("the flags parse");
        ServeArgs::from_arg_matches(&m).expect("serve args")
    }

    const EXAMPLE: &str = include_str!("../../../ops/duet.example.toml");

    #[test]
    fn the_example_parses_and_names_every_flag() {
        let flags = file_flags(EXAMPLE, "duet.example.toml").expect("example");
        let mut argv = os(&["serve"]);
        argv.extend(flags);
        let args = parse(&argv);
        assert_eq!(args.port, 27017);
        // Every flag is in the example, set or as a commented-out key.
        for arg in serve_command().get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "config" {
                continue;
            }
            let present = EXAMPLE.lines().any(|l| {
                let l = l.trim_start_matches('#').trim_start();
                l.starts_with(&format!("{long} ="))
            });
            assert!(present, "ops/duet.example.toml lacks the key '{long}'");
        }
    }

    #[test]
    fn command_line_flags_override_the_file() {
        let dir = std::env::temp_dir().join(format!("duet-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("duet.toml");
        std::fs::write(
            &file,
            "port = 27100\nmax_connections = 7\nauth = true\nallow-disk-use-by-default = false\nslow-ms = 5\n",
        )
        .expect("write");
        let f = file.to_string_lossy().to_string();
        let argv =
            expand_args(os(&["duet", "serve", "--config", &f, "--port", "27200"])).expect("expand");
        let args = parse(&argv[1..]);
        assert_eq!(args.port, 27200, "the command line wins");
        assert_eq!(args.max_connections, 7);
        assert!(args.auth);
        assert!(!args.allow_disk_use_by_default);
        assert_eq!(args.slow_ms, 5);
        let eff = effective(&argv[1..]);
        assert_eq!(eff.get("port"), Some(&Bson::Int64(27200)));
        assert_eq!(eff.get("auth"), Some(&Bson::Boolean(true)));
        assert_eq!(eff.get("bind"), Some(&Bson::String("127.0.0.1".into())));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_by_name() {
        let e = file_flags("prot = 1\n", "x.toml").expect_err("typo");
        assert!(
            e.contains("unknown key 'prot'") && e.contains("x.toml"),
            "{e}"
        );
        let e = file_flags("[net]\nport = 1\n", "x.toml").expect_err("table");
        assert!(e.contains("unknown key 'net'"), "{e}");
        let e = file_flags("bind = [\"a\"]\n", "x.toml").expect_err("array");
        assert!(e.contains("'bind' must be"), "{e}");
        let e = file_flags("auth = 1\n", "x.toml").expect_err("switch");
        assert!(e.contains("is a switch"), "{e}");
        let e = file_flags("config = \"a\"\n", "x.toml").expect_err("nested config");
        assert!(e.contains("unknown key 'config'"), "{e}");
        assert!(file_flags("port = \n", "x.toml").is_err());
        // A value of the wrong kind is refused by the flag's own parser.
        let mut argv = os(&["serve"]);
        argv.extend(file_flags("port = \"many\"\n", "x.toml").expect("flags"));
        assert!(serve_command().try_get_matches_from(&argv).is_err());
    }
}
