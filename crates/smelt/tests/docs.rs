//! The docs that live in the repository stay true to it (issue 21): every repository path
//! that README.md and docs/*.md name in backticks or link to exists, and the architecture
//! page's map names every crate of the workspace. A file moved or a crate added without
//! its docs fails here, not in a new user's first hour.

mod common;

use common::repo_root;

/// Top-level folders whose paths the docs name.
const ROOTS: &[&str] = &["crates/", "bench/", "scripts/", "tests/", "docs/", "fuzz/"];

/// The repository paths a markdown text names: `code spans` and link targets that start
/// with one of [`ROOTS`] (patterns with `<...>` or `*` are skipped), relative to `base` for
/// links.
fn named_paths(text: &str, base: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 1 && !span.contains(char::is_whitespace) {
            out.push(span.to_string());
        }
    }
    for part in text.split("](").skip(1) {
        if let Some(end) = part.find(')') {
            let target = &part[..end];
            if !target.contains("://") && !target.starts_with('#') {
                out.push(format!("{base}{target}"));
            }
        }
    }
    out.into_iter()
        .map(|p| {
            p.split('#')
                .next()
                .unwrap_or_default()
                .trim_end_matches(['.', ',', ':', ';'])
                .to_string()
        })
        .filter(|p| ROOTS.iter().any(|r| p.starts_with(r)))
        .filter(|p| !p.contains(['<', '*']))
        .collect()
}

#[test]
fn paths_the_docs_name_exist() {
    let root = repo_root();
    let mut docs = vec![("README.md".to_string(), String::new())];
    for e in std::fs::read_dir(root.join("docs")).expect("docs/ exists") {
        let name = e.expect("entry").file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            docs.push((format!("docs/{name}"), "docs/".to_string()));
        }
    }
    let mut checked = 0;
    let mut missing = Vec::new();
    for (doc, base) in &docs {
        let text = std::fs::read_to_string(root.join(doc)).expect("read doc");
        for p in named_paths(&text, base) {
            checked += 1;
            // A link from docs/ may climb out of it.
            let resolved = root.join(&p);
            if !resolved.exists() {
                missing.push(format!("{doc}: {p}"));
            }
        }
    }
    assert!(
        checked > 40,
        "only {checked} paths found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "named but missing:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_architecture_page_maps_every_crate_and_the_readme_links_it() {
    let root = repo_root();
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).expect("read");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read");
    assert!(
        readme.contains("](docs/architecture.md)"),
        "README does not link it"
    );
    let mut crates: Vec<String> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    crates.sort();
    assert!(crates.len() >= 10, "{crates:?}");
    let unmapped: Vec<&String> = crates
        .iter()
        .filter(|c| !page.contains(&format!("crates/{c} ")))
        .collect();
    assert!(
        unmapped.is_empty(),
        "docs/architecture.md's map lacks {unmapped:?}"
    );
}
