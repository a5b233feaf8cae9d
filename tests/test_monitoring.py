"""docker/'s monitoring works with what attache exports.

* ``promtool`` (Debian's ``prometheus`` package; ``.ci/run`` installs it)
  accepts the alert rules and the Prometheus config, and runs the rules'
  unit tests (``tests/prometheus/attache_rules_test.yml``): each alert
  fires when it should and stays quiet otherwise.
* Every metric that a rule or a dashboard panel names is in a real
  ``/metrics`` scrape of a deployment whose scheduler ran every service once.
* The compose file mounts these files where the Prometheus and Grafana
  configs expect them, and the dashboard shows a sweeper overdue by the
  alert's own expression.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.web import create_app
from scheduler.__main__ import guarded
from scheduler.runs import SweeperRuns
from scheduler.sweepers import sweepers
from tests.conftest import OPERATOR_TOKEN, authed

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
RULES = DOCKER / "prometheus" / "attache.rules.yml"
PROMETHEUS_CONFIG = DOCKER / "prometheus" / "prometheus.yml"
RULE_TESTS = REPO / "tests" / "prometheus" / "attache_rules_test.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "attache.json"
GRAFANA = DOCKER / "grafana" / "provisioning"
COMPOSE = DOCKER / "compose.yaml"

#: series Prometheus makes itself: the scrape's health and the alerts' state
PROMETHEUS_OWN = {"up", "ALERTS"}

#: Grafana's interval variables, replaced by a duration before PromQL parses the panel's query
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b")


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool missing: install Debian's prometheus package "
                    "(apt-get install --no-install-recommends prometheus; .ci/run does)")
    return path


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel's every query, Grafana's interval variables replaced."""
    return [(panel["title"], GRAFANA_INTERVALS.sub("5m", target["expr"]))
            for panel in dashboard()["panels"] for target in panel.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr!r}"
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def exported_names(text: str) -> set[str]:
    """The series names a scrape of ``text`` gives Prometheus, whether or not a family has samples yet."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in suffixes[family.type])
    return names


def test_promtool_accepts_the_rules(promtool):
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_alerts_fire_when_they_should(promtool, tmp_path):
    """The unit tests run against the rules without their annotations (promtool compares those word for word)."""
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / RULES.name).write_text(yaml.safe_dump(document))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    result = subprocess.run([promtool, "test", "rules", str(tmp_path / RULE_TESTS.name)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr

    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    fired = {case["alertname"] for test in tests["tests"] for case in test.get("alert_rule_test", [])
             if case["exp_alerts"]}
    quiet = {case["alertname"] for test in tests["tests"] for case in test.get("alert_rule_test", [])
             if not case["exp_alerts"]}
    alerts = {rule["alert"] for rule in rules()}
    assert alerts <= fired, f"alerts no unit test sees firing: {sorted(alerts - fired)}"
    assert alerts <= quiet, f"alerts no unit test sees quiet: {sorted(alerts - quiet)}"


def test_the_rules_cover_what_operators_asked_for():
    """Each concern of the monitoring brief has its alert, on the metric that measures it."""
    watched = {rule["alert"]: metric_names(rule["expr"]) for rule in rules()}
    expected = {
        "AttacheOutboxLate": {"attache_outbox_oldest_due_age_seconds"},
        "AttacheDeadLetters": {"attache_dlq_messages"},
        "AttacheLeaseExpiriesRising": {"attache_lease_expiries_total"},
        "AttacheFailureRatioHigh": {"attache_job_transitions_total"},
        "AttacheNothingReady": {"attache_uploads_total", "attache_job_transitions_total", "attache_jobs"},
        "AttacheReconcilerReannouncing": {"attache_reconciler_reannounced_total"},
        "AttacheSweeperOverdue": {"attache_sweeper_last_success_timestamp_seconds",
                                  "attache_sweeper_interval_seconds"},
    }
    for alert, names in expected.items():
        assert alert in watched, f"missing alert {alert}"
        assert names <= watched[alert], (alert, watched[alert])
    for rule in rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_every_metric_named_is_exported(settings, services, engine):
    runs = SweeperRuns(engine)
    for service, interval in [(sweeper.service, sweeper.interval_seconds) for sweeper in sweepers(services)]:
        guarded(service, interval, runs)()
    app = create_app(settings)
    response = authed(app, OPERATOR_TOKEN).get("/metrics")
    app.extensions["attache"].close()
    assert response.status_code == 200
    exported = exported_names(response.get_data(as_text=True))
    assert "attache_sweeper_last_success_timestamp_seconds" in exported, "the scheduler's rounds are exported"

    named_by_rules = set().union(*(metric_names(rule["expr"]) for rule in rules()))
    named_by_dashboard: set[str] = set()
    for title, expr in dashboard_queries():
        try:
            named_by_dashboard |= metric_names(expr)
        except ValueError as exc:
            pytest.fail(f"panel {title!r}: not PromQL: {expr!r}: {exc}")
    assert len(named_by_rules) >= 8 and len(named_by_dashboard) >= 15, (named_by_rules, named_by_dashboard)
    unknown = {name for name in named_by_rules | named_by_dashboard
               if name not in exported and name not in PROMETHEUS_OWN}
    assert not unknown, f"named by the rules or the dashboard but not exported by /metrics: {sorted(unknown)}"


def test_the_dashboard_shows_an_overdue_sweeper_as_the_alert_does():
    overdue = next(rule for rule in rules() if rule["alert"] == "AttacheSweeperOverdue")
    condition = promql_parser.parse(overdue["expr"])
    assert isinstance(condition, promql_parser.BinaryExpr) and str(condition.rhs) == "3"
    showing = [panel for panel in dashboard()["panels"] for target in panel.get("targets", [])
               if str(promql_parser.parse(GRAFANA_INTERVALS.sub("5m", target["expr"]))) == str(condition.lhs)]
    assert showing, "no panel shows the overdue alert's expression"
    steps = showing[0]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert {"color": "red", "value": 3} in steps, steps
    alerts = [title for title, expr in dashboard_queries() if "ALERTS" in metric_names(expr)]
    assert alerts, "the dashboard lists the firing alerts"


def test_the_dashboard_is_provisioned_with_its_data_source():
    board = dashboard()
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    variables = {var["name"]: var for var in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    source = yaml.safe_load((GRAFANA / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert source["type"] == "prometheus" and source["isDefault"]
    assert source["url"] == "http://prometheus:9090"


def test_prometheus_config_is_valid_and_loads_these_rules(promtool, tmp_path):
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert config["rule_files"] == [RULES.name], "the rules next to the config, as tested here"
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "attache" and job["metrics_path"] == "/metrics"
    for rule in rules():  # the rules that look at the scrape itself name this job
        if "up{" in rule["expr"].replace(" ", ""):
            assert 'job="attache"' in rule["expr"], rule["alert"]
    # promtool wants the token file to exist: the container writes it before Prometheus starts
    token = tmp_path / "attache-token"
    token.write_text("an-operator-token")
    job["authorization"]["credentials_file"] = str(token)
    (tmp_path / PROMETHEUS_CONFIG.name).write_text(yaml.safe_dump(config))
    shutil.copy(RULES, tmp_path / RULES.name)
    result = subprocess.run([promtool, "check", "config", str(tmp_path / PROMETHEUS_CONFIG.name)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_runs_prometheus_and_grafana_on_these_files():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    mounts = {}
    for name in ("prometheus", "grafana"):
        service = services[name]
        assert service["profiles"] == ["monitoring"], "started only when asked for"
        assert all(port.startswith("127.0.0.1:") for port in service["ports"]), "this machine only"
        for volume in service["volumes"]:
            source, target = volume.split(":")[:2]
            if source.startswith("./"):
                assert (DOCKER / source).exists(), f"{name} mounts missing {source}"
                mounts[(name, source)] = target
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert mounts[("prometheus", "./prometheus")] == "/etc/prometheus"
    prometheus = services["prometheus"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"][0]
    token_file = config["scrape_configs"][0]["authorization"]["credentials_file"]
    assert f"> {token_file}" in prometheus["command"][0], "the command writes the token the scrape job reads"
    assert (config["scrape_configs"][0]["static_configs"][0]["targets"] == ["web:8000"]
            and "8000:8000" in services["web"]["ports"])
    provider = yaml.safe_load((GRAFANA / "dashboards" / "attache.yml").read_text())["providers"][0]
    assert mounts[("grafana", "./grafana/dashboards")] == provider["options"]["path"]
    assert mounts[("grafana", "./grafana/provisioning")] == "/etc/grafana/provisioning"
    assert "9090:9090" in " ".join(prometheus["ports"]), "Grafana's data source is prometheus:9090"
