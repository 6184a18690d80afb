//! Every relative link in `README.md` and `docs/*.md` resolves.
//!
//! The reference lives in several Markdown files that point into each other by path and by
//! `#anchor`. A renamed heading or a moved file breaks such a link silently: GitHub renders it,
//! and a reader lands on nothing. This test reads the files the way GitHub does (links outside
//! code, anchors as GitHub slugs its headings) and fails naming each broken link. It needs no
//! etcd and reads only files, so it runs with every `cargo test --tests`.

use std::collections::HashMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The repository's root: the files are read where they are checked in.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `README.md` and every Markdown file directly under `docs/`, the pages a reader browses.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let docs = fs::read_dir(root().join("docs")).expect("docs/ is readable");
    let mut docs: Vec<PathBuf> = docs
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of a page that GitHub renders as Markdown text: lines inside fenced code blocks
/// are blank here (their `#` comments are no headings, their brackets no links), so line
/// numbers stay those of the file.
fn prose_lines(text: &str) -> Vec<String> {
    let mut fence: Option<&str> = None;
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            match fence {
                Some(open) => {
                    if trimmed.starts_with(open) {
                        fence = None;
                    }
                    String::new()
                }
                None if trimmed.starts_with("```") || trimmed.starts_with("~~~") => {
                    fence = Some(&trimmed[..3]);
                    String::new()
                }
                None => without_code_spans(line),
            }
        })
        .collect()
}

/// A line with its inline code spans removed: `[--to RFC3339]` in a command's synopsis is
/// not a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|c| *c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                // An unclosed backtick is literal text.
                out.push_str(&rest[start..start + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The anchor GitHub gives a heading's text: lowercased; code marks, and every character that
/// is not a letter, a digit, a space, `-` or `_`, dropped; each space turned into `-`.
fn slug(heading: &str) -> String {
    let text = link_texts(heading);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// A heading's rendered text: `[text](target)` becomes `text`.
fn link_texts(heading: &str) -> String {
    let mut out = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find("](") {
        let Some(close) = closing_paren(&rest[open + 2..]) else {
            break;
        };
        out.push_str(&rest[..open]);
        rest = &rest[open + 2 + close + 1..];
    }
    out.push_str(rest);
    out.replace(['[', '`'], "")
}

/// Where the `)` that closes a link's target is, in the text after its `(`; parentheses
/// inside the target must balance, as in CommonMark.
fn closing_paren(after_open: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (at, c) in after_open.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(at),
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Every anchor a page offers: one per heading, and for a heading text seen before, GitHub's
/// `-1`, `-2`... suffixes.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = Vec::new();
    for line in prose_lines_keeping_code(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.push(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// Like `prose_lines`, but keeping inline code: a heading such as ``## `status --json` ``
/// takes its anchor from the code's text.
fn prose_lines_keeping_code(text: &str) -> Vec<String> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            lines.push(line.to_string());
        }
    }
    lines
}

/// A link found in a page: its line (1-based) and its target as written.
struct Link {
    line: usize,
    target: String,
}

/// Every inline link and image of a page (`[text](target)`, `![alt](target)`) outside code.
fn links(text: &str) -> Vec<Link> {
    let mut links = Vec::new();
    for (index, line) in prose_lines(text).iter().enumerate() {
        let mut rest = line.as_str();
        while let Some(open) = rest.find("](") {
            let after = &rest[open + 2..];
            let Some(close) = closing_paren(after) else {
                break;
            };
            // A target may carry a title after a space: `(path "title")`.
            let target = after[..close].split_whitespace().next().unwrap_or("");
            let target = target.trim_start_matches('<').trim_end_matches('>');
            links.push(Link {
                line: index + 1,
                target: target.to_string(),
            });
            rest = &after[close + 1..];
        }
    }
    links
}

/// Whether a target leaves the repository's files: a URL with a scheme, or a mail address.
fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// `a/../b` as `b`, without asking the file system (which would follow symbolic links).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// A path as the repository names it, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

/// What is wrong with one link of `page`, if anything.
fn check(page: &Path, target: &str) -> Option<String> {
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    if path.starts_with('/') {
        return Some("an absolute path: GitHub reads it from the site's root".to_string());
    }
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        normalize(&page.parent().expect("a page is in a directory").join(path))
    };
    if !file.starts_with(root()) {
        return Some(format!("{} is outside the repository", shown(&file)));
    }
    if !file.exists() {
        return Some(format!("{} does not exist", shown(&file)));
    }
    let anchor = anchor?;
    if file.extension().is_none_or(|ext| ext != "md") {
        return Some(format!("#{anchor} into {}, which has no headings", shown(&file)));
    }
    let text = fs::read_to_string(&file).expect("a linked Markdown file is readable");
    if anchors(&text).iter().any(|known| known == anchor) {
        None
    } else {
        Some(format!("{} has no heading whose anchor is #{anchor}", shown(&file)))
    }
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = fs::read_to_string(&page).expect("page is readable");
        for link in links(&text) {
            if is_external(&link.target) {
                continue;
            }
            checked += 1;
            if let Some(problem) = check(&page, &link.target) {
                broken.push(format!("{}:{}: ({}): {problem}", shown(&page), link.line, link.target));
            }
        }
    }
    // A page with no links at all would pass trivially; the README alone has more than this.
    assert!(
        checked >= 20,
        "only {checked} relative links found: is the parser broken?"
    );
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn slugs_are_githubs() {
    // GitHub's own anchors for headings of this kind, as it renders them.
    for (heading, anchor) in [
        ("Quick start", "quick-start"),
        ("`status --json`", "status---json"),
        ("etcd's space", "etcds-space"),
        ("HTTP: probes, API and dashboard", "http-probes-api-and-dashboard"),
        ("Hash-spread schedules (`H`)", "hash-spread-schedules-h"),
        (
            "Catch-up: 100000 per-minute jobs over 64 shards, records 2 h old, catch_up = \"all\", one node",
            "catch-up-100000-per-minute-jobs-over-64-shards-records-2-h-old-catch_up--all-one-node",
        ),
        (
            "100 concurrent `GET /api/v1/plan?for=100y` (10,000 fires, 1.1 MiB each)",
            "100-concurrent-get-apiv1planfor100y-10000-fires-11-mib-each",
        ),
        ("See [Security](security.md)", "see-security"),
    ] {
        assert_eq!(slug(heading), anchor, "{heading}");
    }
    // A heading repeated on one page gets a numbered anchor.
    assert_eq!(
        anchors("# A\n## A\n```\n# not a heading\n```\n### A\n"),
        ["a", "a-1", "a-2"]
    );
}

#[test]
fn links_in_code_are_not_links() {
    let page = "[one](a.md)\n`[two](b.md)`\n```\n[three](c.md)\n```\n![four](d.png \"title\")\n";
    let targets: Vec<String> = links(page).into_iter().map(|link| link.target).collect();
    assert_eq!(targets, ["a.md", "d.png"]);
}
