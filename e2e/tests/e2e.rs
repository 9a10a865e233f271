//! Every e2e scenario against the private libvirtd. Needs
//! `CAPL_TEST_LIBVIRT_URI` (`cargo xtask host up`) and the control plane in
//! the cache (`cargo xtask control-plane build`); fails naming them when
//! missing. `cargo xtask e2e` prepares everything and runs the same suite
//! with a summary table.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_scenarios_pass_on_a_real_libvirtd() {
    let config = e2e::harness::stack::StackConfig::from_env(false).expect("e2e prerequisites");
    let outcomes = e2e::scenarios::suite::run(&config, &[]).await.expect("running the e2e suite");
    let table = e2e::scenarios::suite::table(&outcomes);
    println!("{table}");
    assert!(outcomes.iter().all(|o| o.passed), "e2e scenarios failed:\n{table}");
}
