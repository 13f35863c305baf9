//! The deployment files in `deploy/`: the Prometheus recording rules and alerts checked and
//! unit-tested by `promtool` (Debian's `prometheus`, installed by `scripts/prometheus-deps.sh`),
//! and the Kubernetes manifests validated against the Kubernetes 1.31 schemas by
//! `kubernetes-validate` (PyPI, `scripts/k8s-deps.sh`). A real Prometheus scraping two workers
//! with these rules, and the Grafana dashboard's queries, are in `serve.rs`.

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    tokenmill_testutil::workspace_root()
}

/// Runs `scripts/<script>`, which installs a tool, and returns the path it prints last.
fn install(script: &str) -> PathBuf {
    let out = Command::new("bash")
        .arg(root().join("scripts").join(script))
        .output()
        .expect("running the installer");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("a path").trim())
}

fn ok(out: Output, what: &str) -> String {
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what}:\n{text}");
    text
}

#[test]
fn promtool_checks_and_unit_tests_the_slo_rules() {
    let promtool = install("prometheus-deps.sh").join("promtool");
    let dir = root().join("deploy/prometheus");
    let check = Command::new(&promtool)
        .args(["check", "rules", "rules.yml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let text = ok(check, "promtool check rules");
    assert!(text.contains("SUCCESS: 9 rules found"), "{text}");
    let test = Command::new(&promtool)
        .args(["test", "rules", "rules_test.yml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    ok(test, "promtool test rules");
}

#[test]
fn kubernetes_manifests_validate_against_the_schemas() {
    let validate = install("k8s-deps.sh");
    let dir = root().join("deploy/k8s");
    let files = ["tokenmill.yaml", "autoscaling.yaml"];
    let out = Command::new(&validate)
        .arg("--strict")
        .args(files)
        .current_dir(&dir)
        .output()
        .unwrap();
    let text = ok(out, "kubernetes-validate");
    for kind in [
        "deployment/tokenmill",
        "service/tokenmill",
        "configmap/prometheus-adapter-tokenmill",
        "horizontalpodautoscaler/tokenmill",
    ] {
        assert!(
            text.contains(&format!("passed for resource {kind}")),
            "{text}"
        );
    }
    // The validator does fail a wrong manifest.
    let bad = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        bad.path(),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: two}\n",
    )
    .unwrap();
    let out = Command::new(&validate)
        .arg("--strict")
        .arg(bad.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
}
