//! `docs/contract.md` names the scenario that proves each guarantee: every scenario of the
//! suite must appear there, so a new one cannot be added without saying what it proves.

#[test]
fn every_scenario_is_named_in_the_contract() {
    let contract = include_str!("../../docs/contract.md");
    let missing: Vec<&str> = conformance_tests::scenarios::ALL
        .iter()
        .map(|scenario| scenario.name)
        .filter(|name| !contract.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "scenarios missing from docs/contract.md: {missing:?}"
    );
}
