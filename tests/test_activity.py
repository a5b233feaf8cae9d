"""The dashboard's charts: an hour or a day of activity from PostgreSQL (app/core/activity.py), drawn as SVG.

The rows are written with times relative to the database's clock, so each
lands in a known bucket; a real headless Chromium draws the dashboard and
keeps a screenshot (see ``test_the_dashboard_draws_its_charts_in_a_real_browser``).
"""

from __future__ import annotations

import io
import re
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert, text

from app.adapters.postgres.models import (
    attachments,
    dead_letters,
    job_history,
    jobs,
    outbox,
)
from app.config import Settings
from app.core import activity
from app.web import create_app
from app.web.charts import (
    PALETTE,
    Series,
    axis_top,
    bar_chart,
    line_chart,
    nice_ceiling,
)
from tests.conftest import OPERATOR_TOKEN
from tests.test_console import CSP, signed_in

NOWHERE = "amqp://guest:guest@127.0.0.1:1/%2F"


def seed_activity(engine) -> datetime:
    """Uploads, outcomes, outbox rows and dead letters at known minutes before now; returns the database's now.

    ==========  ==========================================================
    minutes ago what
    ==========  ==========================================================
    2 days      an upload (outside both windows)
    180         two uploads; a dead letter in attache.inspect.XQ
    30          an upload, ready 30 s later
    20..10      an outbox message waits 10 minutes for RabbitMQ
    15          two dead letters in attache.render.XQ
    10          a job fails (corrupt_image); another's retry (storage_unavailable)
    5           three uploads, one ready 60 s later
    2           an outbox message still waiting
    ==========  ==========================================================
    """
    with engine.begin() as conn:
        now = conn.execute(text("SELECT now()")).scalar_one()

        def ago(minutes: float) -> datetime:
            return now - timedelta(minutes=minutes)

        def upload(minutes: float, ready_after: float | None = None, state: str = "queued"):
            attachment_id, job_id = uuid.uuid4(), uuid.uuid4()
            conn.execute(insert(attachments).values(
                id=attachment_id, owner="alice", filename="a.jpg", content_type="image/jpeg", format="JPEG",
                size=1, sha256="0" * 64, width=1, height=1, staging_key=f"staging/{attachment_id}",
                created_at=ago(minutes)))
            conn.execute(insert(jobs).values(
                id=job_id, attachment_id=attachment_id, owner="alice", pipeline_version=1, max_attempts=3,
                traceparent="00-x",
                state="ready" if ready_after is not None else state, attempt=1, created_at=ago(minutes),
                updated_at=ago(minutes), error_code="corrupt_image" if state == "failed" else None,
                ready_at=ago(minutes) + timedelta(seconds=ready_after) if ready_after is not None else None))
            return job_id

        upload(60 * 48)
        upload(180)
        upload(180)
        upload(30, ready_after=30)
        upload(5, ready_after=60)
        upload(5)
        failed = upload(5, state="failed")
        conn.execute(insert(job_history).values([
            dict(job_id=failed, at=ago(10), from_state="processing", to_state="failed", attempt=1,
                 actor="worker:test", error_code="corrupt_image", reason="bad bytes"),
            dict(job_id=failed, at=ago(10), from_state="processing", to_state="queued", attempt=1,
                 actor="worker:test", error_code="storage_unavailable", reason="down"),
        ]))
        for created, published in ((20, 10), (2, None)):
            conn.execute(insert(outbox).values(
                job_id=failed, message_id=uuid.uuid4(), queue_name="attache.inspect", actor_name="inspect",
                payload={"step": "inspect", "attempt": 1}, created_at=ago(created), available_at=ago(created),
                published_at=None if published is None else ago(published)))
        for queue, minutes in (("attache.render", 15), ("attache.render", 15), ("attache.inspect", 180)):
            conn.execute(insert(dead_letters).values(
                message_id=str(uuid.uuid4()), queue_name=queue, actor_name="render", error_code="effect_missing",
                reason="test", recorded_at=ago(minutes)))
    return now


def bucket_of(data: dict, moment: datetime) -> int:
    starts = [datetime.fromisoformat(t) for t in data["times"]]
    return max(i for i, start in enumerate(starts) if start <= moment)


def test_an_hour_per_minute(engine):
    now = seed_activity(engine)
    data = activity.activity(engine, "hour")
    assert len(data["times"]) == 60 and data["bucket_seconds"] == 60
    assert datetime.fromisoformat(data["times"][-1]) <= now < datetime.fromisoformat(data["end"]), \
        "the last bucket is the current minute"
    assert sum(data["uploads"]) == 4, "3 five minutes ago, 1 half an hour ago; none older"
    assert data["uploads"][bucket_of(data, now - timedelta(minutes=5))] == 3
    assert sum(data["ready"]) == 2
    ready_at = bucket_of(data, now - timedelta(minutes=4))
    assert data["ready"][ready_at] == 1 and data["latency_p50"][ready_at] == pytest.approx(60.0)
    assert data["latency_p99"][ready_at] == pytest.approx(60.0)
    assert data["latency_p50"][bucket_of(data, now - timedelta(minutes=29.5))] == pytest.approx(30.0)
    assert data["latency_p50"].count(None) == 58, "no percentile where nothing became ready"
    assert sum(data["failed"]) == 1 and data["failed"][bucket_of(data, now - timedelta(minutes=10))] == 1
    assert data["failures_by_code"] == [{"error_code": "corrupt_image", "failed": 1, "retried": 0},
                                        {"error_code": "storage_unavailable", "failed": 0, "retried": 1}]
    assert data["dead_letters"] == {"attache.render": [2 if i == bucket_of(data, now - timedelta(minutes=15)) else 0
                                                       for i in range(60)]}


def test_the_outbox_backlog_is_what_was_waiting_at_the_end_of_each_bucket(engine):
    now = seed_activity(engine)
    for window in ("hour", "day"):
        data = activity.activity(engine, window)
        step = timedelta(seconds=data["bucket_seconds"])
        ends = [datetime.fromisoformat(t) + step for t in data["times"][:-1]] + [now]
        rows = [(now - timedelta(minutes=20), now - timedelta(minutes=10)), (now - timedelta(minutes=2), None)]
        expected = [sum(1 for created, published in rows if created <= end and (published is None or published > end))
                    for end in ends]
        assert data["outbox_backlog"] == expected, window
        assert max(expected) == 1 and expected[-1] == 1, "the test covers a waiting message and a published one"


def test_a_day_per_quarter_hour(engine):
    now = seed_activity(engine)
    data = activity.activity(engine, "day")
    assert len(data["times"]) == 96 and data["bucket_seconds"] == 900
    assert sum(data["uploads"]) == 6 and data["uploads"][bucket_of(data, now - timedelta(minutes=180))] == 2
    assert set(data["dead_letters"]) == {"attache.inspect", "attache.render"}
    assert sum(data["dead_letters"]["attache.render"]) == 2
    with pytest.raises(ValueError, match="window must be one of hour, day"):
        activity.activity(engine, "week")


def test_an_empty_database_draws_flat_lines(engine):
    data = activity.activity(engine, "hour")
    assert data["uploads"] == [0] * 60 and data["outbox_backlog"] == [0] * 60
    assert data["latency_p50"] == [None] * 60 and data["dead_letters"] == {} and data["failures_by_code"] == []


def test_charts_are_svg_with_words_for_screen_readers_and_escaped_names():
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 3, 7, 11, 240, 2600)] == [1, 0.5, 1, 5, 10, 20, 250, 5000]
    assert [axis_top(v, whole=True) for v in (0, 2, 3, 7, 90)] == [4, 4, 4, 8, 100], "counts step by whole numbers"
    assert [axis_top(v, whole=False) for v in (0.3, 2, 61)] == [0.4, 2, 80]
    times = [f"2026-12-01T12:{m:02d}:00+00:00" for m in range(4)]
    chart = str(line_chart("c", "Queues <per minute>", times, [
        Series("q<script>", [1, None, 3, 0], PALETTE[0]),
        Series("latency", [None, None, 2.5, None], PALETTE[1], summed=False),
    ], unit=" s", tick_every=timedelta(minutes=2)))
    assert "<script" not in chart and "q&lt;script&gt;" in chart and "Queues &lt;per minute&gt;" in chart
    assert 'role="img"' in chart and 'aria-labelledby="c-title c-desc"' in chart
    assert "highest 3 s at 12:02 UTC, 4 in all, latest 0 s" in chart, "the description says it in words"
    assert chart.count("<polyline") == 1, "the gap splits the first series; the second is one lone point"
    assert re.search(r'<circle cx="[\d.]+" cy="[\d.]+" r="2.5"', chart), "a lone value is a dot"
    assert "<title>12:02 UTC · q&lt;script&gt;: 3 s</title>" in chart, "each point says its value on hover"
    assert [label for label in re.findall(r">(12:\d\d)</text>", chart)] == ["12:00", "12:02"], "a label every 2 min"
    bars = str(bar_chart("b", "Failures", [("corrupt_image", [3, 1])], [("failed", "#a00"), ("retried", "#aa0")]))
    assert "corrupt_image: 3 failed" in bars and bars.count("<rect") == 2 + 2, "two bars, two legend swatches"


@pytest.fixture
def app(env):
    app = create_app(Settings.from_env({**env, "BROKER_URL": NOWHERE, "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5"}))
    yield app
    app.extensions["attache"].close()


def test_the_dashboard_draws_five_charts_with_no_script_under_the_same_csp(app, engine):
    seed_activity(engine)
    client = signed_in(app)
    page = client.get("/ops")
    assert page.status_code == 200 and page.headers["Content-Security-Policy"] == CSP
    assert "<script" not in page.text.lower()
    for chart in ("chart-throughput", "chart-latency", "chart-outbox", "chart-dead-letters", "chart-failures"):
        assert re.search(rf'<figure class="chart" id="{chart}"><figcaption>[^<]+</figcaption><svg ', page.text), chart
    assert "Uploads accepted, ready and failed per minute" in page.text
    assert 'aria-current="page">Last hour<' in page.text
    day = client.get("/ops?window=day")
    assert day.status_code == 200 and 'aria-current="page">Last day<' in day.text
    assert "per 15 minutes" in day.text and "attache.inspect" in day.text
    assert client.get("/ops?window=week").status_code == 404


#: where the browser test keeps its screenshots for people to look at (git ignores it)
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "console"


@pytest.mark.processes
def test_the_dashboard_draws_its_charts_in_a_real_browser(env, engine, tmp_path):
    """Chromium renders the SVG under the console's CSP, without a script.

    Screenshots, kept in ``artifacts/console/`` at the top of the checkout:
    ``dashboard-hour.png`` and ``dashboard-day.png`` (the whole page) and
    ``chart-throughput.png`` (the first chart, whose pixels are checked).
    """
    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    from tests.browser import browsing, waiting
    from tests.processes import Deployment

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name in ("dashboard-hour.png", "dashboard-day.png", "chart-throughput.png"):
        (ARTIFACTS / name).unlink(missing_ok=True)
    seed_activity(engine)
    deployment = Deployment(env, tmp_path)
    with browsing(deployment, tmp_path, "web") as driver:
        wait = waiting(driver)
        driver.get(deployment.url + "/ops/login")
        wait.until(EC.visibility_of_element_located((By.ID, "token"))).send_keys(OPERATOR_TOKEN)
        driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
        figure = wait.until(EC.visibility_of_element_located((By.ID, "chart-throughput")))
        assert driver.find_elements(By.TAG_NAME, "script") == []
        svg = figure.find_element(By.TAG_NAME, "svg")
        assert svg.size["width"] > 300 and svg.size["height"] > 100, svg.size
        assert len(figure.find_elements(By.TAG_NAME, "polyline")) == 3
        driver.set_window_size(1280, 2400)  # the whole dashboard in one screenshot
        driver.save_screenshot(str(ARTIFACTS / "dashboard-hour.png"))
        shot = ARTIFACTS / "chart-throughput.png"
        figure.screenshot(str(shot))
        image = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
        blue = tuple(int(PALETTE[0][i:i + 2], 16) for i in (1, 3, 5))
        raw = image.tobytes()
        pixels = (raw[i:i + 3] for i in range(0, len(raw), 3))
        drawn = sum(1 for pixel in pixels if sum(abs(a - b) for a, b in zip(pixel, blue)) < 60)
        assert drawn > 20, "the uploads line is drawn in its colour"

        driver.find_element(By.LINK_TEXT, "Last day").click()
        wait.until(EC.text_to_be_present_in_element((By.ID, "chart-dead-letters"), "attache.inspect"))
        assert len(driver.find_element(By.ID, "chart-failures").find_elements(By.CSS_SELECTOR, "svg rect")) >= 2
        driver.save_screenshot(str(ARTIFACTS / "dashboard-day.png"))
    for name in ("dashboard-hour.png", "dashboard-day.png", "chart-throughput.png"):
        assert (ARTIFACTS / name).stat().st_size > 10_000, name
    print(f"\nscreenshots in {ARTIFACTS}")
