//! The documents generated from the code stay equal to it: `docs/tunables.md` is what
//! `weft::tunables_markdown()` makes from the tables `weft info` prints.
#![allow(missing_docs)]

#[test]
fn docs_tunables_md_is_the_tables_weft_info_prints() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/tunables.md");
    let want = weft::tunables_markdown();
    if std::env::var_os("WEFT_BLESS").is_some() {
        std::fs::write(&path, &want).expect("write docs/tunables.md");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    // Every variable `weft info` lists is in the document.
    for (_, table) in weft::TUNABLE_TABLES {
        for t in table.iter() {
            assert!(
                have.contains(&format!("| `{}` |", t.name)),
                "docs/tunables.md lacks {}; run WEFT_BLESS=1 cargo test --test docs",
                t.name
            );
        }
    }
    assert!(
        have == want,
        "docs/tunables.md differs from the tunables tables; run WEFT_BLESS=1 cargo test --test docs"
    );
}
