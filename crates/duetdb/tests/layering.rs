//! The engine's layering, enforced: every `crate::…` path in the engine's
//! sources names a module of the same or a lower layer. The table is the one
//! in docs/design.md §1; change both together.
//!
//! It reads the sources as text (no compiler involvement): a path is any
//! `crate::name` outside comments, in `use` lines and in expressions alike.
//! `crate::Name` (a root re-export) is refused inside the engine: a module
//! names what it uses by its real path, so the check sees it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Lowest first. A module may use its own layer and every layer before it.
const LAYERS: &[&str] = &[
    "error",      // the error type; uses nothing
    "doc",        // values, documents, paths, raw field lookup, type names
    "store",      // heap, B+tree, indexes, collection and database states, VLS marks
    "query",      // filters, updates, projections, sorts, pipelines, the planner
    "durability", // WAL, effects, checkpoints, manifest, recovery, file system seam
    "write",      // the single writer and what each command does
    "snapshot",   // strategies and choose(), scans, VLS scans, OLCP, named snapshots
    "txn",        // the commit protocol of transactions
    "api",        // Database, Collection, Find, Snapshot, Transaction, Engine
    "check",      // the snapshot checker and the crash campaign
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == module)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The code of a line: without `//` comments (doc comments included).
fn code(line: &str) -> &str {
    match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    }
}

/// Every `crate::<ident>` in `text`, with its line number; a grouped import
/// (`use crate::{a, b::{c, d}}`, possibly over several lines) yields the
/// first segment of each top-level item.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let stripped: String = text.lines().map(code).collect::<Vec<_>>().join("\n");
    let ident = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let line_of = |pos: usize| stripped[..pos].matches('\n').count() + 1;
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = stripped[from..].find("crate::") {
        let at = from + i;
        let after = &stripped[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // Split the group at its top-level commas.
            let (mut depth, mut start) = (0usize, 0usize);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.push((line_of(at), ident(&group[start..j])));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push((line_of(at), ident(&group[start..j])));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.push((line_of(at), ident(after)));
        }
        from = at + "crate::".len();
    }
    out.retain(|(_, s)| !s.is_empty());
    out
}

/// Upward imports and root re-export uses, as messages.
fn violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or("")
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" {
            continue; // the crate root only declares modules and re-exports
        }
        let Some(mine) = layer_of(&top) else {
            bad.push(format!(
                "{}: module '{top}' is in no layer (add it to LAYERS and docs/design.md §1)",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&f).expect("read source");
        for (line, name) in crate_paths(&text) {
            match layer_of(&name) {
                Some(theirs) if theirs > mine => bad.push(format!(
                    "{}:{line}: layer '{top}' imports higher layer '{name}'",
                    rel.display()
                )),
                Some(_) => {}
                None => bad.push(format!(
                    "{}:{line}: 'crate::{name}' is not a layer module (use the module path, not a root re-export)",
                    rel.display()
                )),
            }
        }
    }
    bad
}

fn engine_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_module_imports_a_higher_layer() {
    let bad = violations(&engine_src());
    assert!(bad.is_empty(), "layering violations:\n{}", bad.join("\n"));
}

#[test]
fn a_planted_upward_import_is_caught() {
    // A copy of the sources with one forbidden import added to the lowest
    // layer: the check must report exactly that line.
    let tmp = tempfile::tempdir().expect("tmp");
    copy_dir(&engine_src(), tmp.path());
    let victim = tmp.path().join("doc").join("mod.rs");
    let mut text = std::fs::read_to_string(&victim).expect("read");
    text.push_str("\n#[allow(unused_imports)]\nuse crate::api::database::Database;\n");
    std::fs::write(&victim, text).expect("write");
    let bad = violations(tmp.path());
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].contains("layer 'doc' imports higher layer 'api'"),
        "{bad:?}"
    );
    // And a grouped import, and a root re-export.
    let victim = tmp.path().join("store").join("heap.rs");
    let mut text = std::fs::read_to_string(&victim).expect("read");
    text.push_str(
        "\nuse crate::{\n    doc::DocRef,\n    write::{writer::Writer, command::Command},\n};\nfn f() -> crate::Database { panic!() }\n",
    );
    std::fs::write(&victim, text).expect("write");
    let bad = violations(tmp.path());
    assert_eq!(bad.len(), 3, "{bad:?}");
    assert!(
        bad.iter()
            .any(|b| b.contains("layer 'store' imports higher layer 'write'")),
        "{bad:?}"
    );
    assert!(
        bad.iter()
            .any(|b| b.contains("'crate::Database' is not a layer module")),
        "{bad:?}"
    );
}

#[test]
fn the_layer_table_matches_the_design_doc() {
    let design =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/design.md"))
            .expect("read docs/design.md");
    let mut found = BTreeMap::new();
    for line in design.lines() {
        // Rows of the §1 table: "| 3 | `query/` | …".
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() > 3 {
            if let Ok(n) = cells[1].parse::<usize>() {
                let name = cells[2].trim_matches('`').trim_end_matches('/');
                found.insert(n, name.to_string());
            }
        }
    }
    let listed: Vec<&str> = found.values().map(String::as_str).collect();
    assert_eq!(
        listed, LAYERS,
        "docs/design.md §1 lists the layers in another order"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).expect("read") {
        let p = e.expect("entry").path();
        let dest = to.join(p.file_name().expect("name"));
        if p.is_dir() {
            std::fs::create_dir_all(&dest).expect("mkdir");
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).expect("copy");
        }
    }
}
