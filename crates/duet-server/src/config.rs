//! `duet serve --config duet.toml`: a TOML file holding `duet serve` flags
//! as top-level keys (`max-connections = 500`, or `max_connections`), or a
//! YAML file (`.yaml`/`.yml`, as `mongod.conf`) holding the same keys
//! (`max-connections: 500`), and the effective configuration
//! `getCmdLineOpts` reports.
//!
//! The file is turned into flags placed before the command line's own, and
//! the `serve` command lets a later flag override an earlier one, so a flag
//! given on the command line wins over the file; clap then parses and checks
//! everything once, so the file accepts exactly what the flags accept.
//!
//! Invariants:
//! - a key that is not a `duet serve` flag is refused, naming the key (and
//!   the file); so are tables, arrays and the key `config` itself; both
//!   formats give the same flags for the same keys and values (one code
//!   path after parsing: [`Scalar`]);
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

/// One value of a configuration file, whatever its format.
enum Scalar {
    Str(String),
    Int(i64),
    Float(String),
    Bool(bool),
    /// Not a scalar (table, array, null, …): its kind, for the error.
    Other(&'static str),
}

/// Whether `file` is YAML (by its extension); anything else is TOML.
fn is_yaml(file: &str) -> bool {
    let lower = file.to_ascii_lowercase();
    lower.ends_with(".yaml") || lower.ends_with(".yml")
}

fn toml_entries(text: &str, file: &str) -> Result<Vec<(String, Scalar)>, String> {
    let table: toml::Table = text
        .parse()
        .map_err(|e| format!("{file}: not valid TOML: {e}"))?;
    Ok(table
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                toml::Value::String(s) => Scalar::Str(s),
                toml::Value::Integer(i) => Scalar::Int(i),
                toml::Value::Float(f) => Scalar::Float(f.to_string()),
                toml::Value::Boolean(b) => Scalar::Bool(b),
                other => Scalar::Other(other.type_str()),
            };
            (k, v)
        })
        .collect())
}

fn yaml_entries(text: &str, file: &str) -> Result<Vec<(String, Scalar)>, String> {
    use yaml_rust2::{Yaml, YamlLoader};
    let docs =
        YamlLoader::load_from_str(text).map_err(|e| format!("{file}: not valid YAML: {e}"))?;
    let map = match docs.len() {
        0 => return Ok(Vec::new()),
        1 => match docs.into_iter().next() {
            Some(Yaml::Hash(map)) => map,
            Some(Yaml::Null) | None => return Ok(Vec::new()),
            Some(_) => {
                return Err(format!(
                    "{file}: the YAML must be a mapping of flags to values"
                ))
            }
        },
        _ => return Err(format!("{file}: one YAML document only, not several")),
    };
    map.into_iter()
        .map(|(k, v)| {
            let key = match k {
                Yaml::String(s) => s,
                other => return Err(format!("{file}: a key must be a flag name, not {other:?}")),
            };
            let v = match v {
                Yaml::String(s) => Scalar::Str(s),
                Yaml::Integer(i) => Scalar::Int(i),
                Yaml::Real(r) => Scalar::Float(r),
                Yaml::Boolean(b) => Scalar::Bool(b),
                Yaml::Hash(_) => Scalar::Other("table"),
                Yaml::Array(_) => Scalar::Other("array"),
                Yaml::Null => Scalar::Other("null"),
                Yaml::Alias(_) | Yaml::BadValue => Scalar::Other("alias"),
            };
            Ok((key, v))
        })
        .collect()
}

/// The flags a configuration file's text stands for (YAML when `file`
/// ends in `.yaml`/`.yml`, TOML otherwise).
pub fn file_flags(text: &str, file: &str) -> Result<Vec<OsString>, String> {
    let entries = if is_yaml(file) {
        yaml_entries(text, file)?
    } else {
        toml_entries(text, file)?
    };
    let sep = if is_yaml(file) { ":" } else { " =" };
    let command = serve_command();
    let mut out = Vec::new();
    for (key, value) in entries {
        let long = key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && long != "config")
            .ok_or_else(|| {
                format!(
                    "{file}: unknown key '{key}': not a `duet serve` flag (every flag is a key, \
                     e.g. max-connections{sep} 500; see ops/duet.example.toml)"
                )
            })?;
        let switch = matches!(arg.get_action(), ArgAction::SetTrue);
        let text = match value {
            Scalar::Bool(b) if switch => {
                if b {
                    out.push(OsString::from(format!("--{long}")));
                }
                continue;
            }
            _ if switch => {
                return Err(format!(
                    "{file}: key '{key}' is a switch: write {key}{sep} true or false"
                ))
            }
            Scalar::Str(s) => s,
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => f,
            Scalar::Bool(b) => b.to_string(),
            Scalar::Other(kind) => {
                return Err(format!(
                    "{file}: key '{key}' must be a string, number or boolean, not {kind}"
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
    fn a_yaml_file_gives_the_same_flags_as_toml() {
        let toml = "port = 27100\nmax_connections = 7\nauth = true\n\
                    allow-disk-use-by-default = false\nbind = \"0.0.0.0\"\n";
        let yaml = "# as mongod.conf\nport: 27100\nmax_connections: 7\nauth: true\n\
                    allow-disk-use-by-default: false\nbind: \"0.0.0.0\"\n";
        // TOML's keys come sorted, YAML's in file order: the same set.
        let sorted = |mut v: Vec<OsString>| {
            v.sort();
            v
        };
        let from_toml = sorted(file_flags(toml, "duet.toml").expect("toml"));
        assert_eq!(
            sorted(file_flags(yaml, "duet.yaml").expect("yaml")),
            from_toml
        );
        assert_eq!(
            sorted(file_flags(yaml, "/etc/DUET.YML").expect("yml")),
            from_toml
        );
        let mut argv = os(&["serve"]);
        argv.extend(from_toml);
        let args = parse(&argv);
        assert_eq!(
            (args.port, args.max_connections, args.auth),
            (27100, 7, true)
        );
        // Through --config, with the command line still winning.
        let dir = std::env::temp_dir().join(format!("duet-config-yaml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("duet.yaml");
        std::fs::write(&file, yaml).expect("write");
        let f = file.to_string_lossy().to_string();
        let argv =
            expand_args(os(&["duet", "serve", "--config", &f, "--port", "27200"])).expect("expand");
        let args = parse(&argv[1..]);
        assert_eq!((args.port, args.max_connections), (27200, 7));
        std::fs::remove_dir_all(&dir).ok();
        // The same refusals as TOML, in YAML's words.
        let e = file_flags("prot: 1\n", "x.yaml").expect_err("typo");
        assert!(
            e.contains("unknown key 'prot'") && e.contains("x.yaml"),
            "{e}"
        );
        let e = file_flags("net:\n  port: 1\n", "x.yaml").expect_err("nested");
        assert!(e.contains("unknown key 'net'"), "{e}");
        let e = file_flags("bind: [a]\n", "x.yaml").expect_err("array");
        assert!(e.contains("'bind' must be") && e.contains("array"), "{e}");
        let e = file_flags("bind:\n", "x.yaml").expect_err("null");
        assert!(e.contains("not null"), "{e}");
        let e = file_flags("auth: 1\n", "x.yaml").expect_err("switch");
        assert!(e.contains("auth: true"), "{e}");
        assert!(file_flags("port: [\n", "x.yaml")
            .expect_err("syntax")
            .contains("not valid YAML"));
        assert!(file_flags("- 1\n", "x.yaml")
            .expect_err("list")
            .contains("mapping"));
        assert!(file_flags("port: 1\n---\nport: 2\n", "x.yaml")
            .expect_err("two documents")
            .contains("one YAML document"));
        assert!(file_flags("", "x.yaml").expect("empty").is_empty());
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
