#!/usr/bin/python3
"""Writes deploy/grafana/dashboards/kvpool.json, the kvpool Grafana dashboard.

The dashboard is generated so that its queries can be read and reviewed here, in one place;
edit this file and run it (`deploy/grafana/generate_dashboard.py`), do not edit the JSON by hand.
CI (deploy/checks/check_monitoring.py) fails when the JSON differs from what this writes, and
checks every query against deploy/metrics.yaml.

Works with Grafana 10 and 11 (schemaVersion 39). The data source is a dashboard variable, so the
same JSON works with the compose Grafana (provisioned) and when imported into any other.
"""

import json
import pathlib
import sys

OUT = pathlib.Path(__file__).resolve().parent / "dashboards" / "kvpool.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
SEG = 'segment=~"$segment"'
INST = 'instance=~"$instance"'
PUT_START = 'method=~"(.*/)?BatchPutStart"'
GET_LIST = 'method=~"(.*/)?BatchGetReplicaList"'

_next_id = 0


def _id():
    global _next_id
    _next_id += 1
    return _next_id


def target(expr, legend="__auto", ref="A"):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def targets(*pairs):
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def thresholds(*steps):
    """steps: (value or None for the base, color)."""
    return {"mode": "absolute", "steps": [{"value": v, "color": c} for v, c in steps]}


def row(title, y):
    return {"type": "row", "id": _id(), "title": title, "collapsed": False,
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []}


def stat(title, description, expr, unit, x, y, steps, w=4, h=4, decimals=None):
    defaults = {"unit": unit, "thresholds": thresholds(*steps), "color": {"mode": "thresholds"}}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat", "id": _id(), "title": title, "description": description, "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [target(expr, title)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "background", "graphMode": "area", "justifyMode": "auto",
                    "textMode": "value", "orientation": "auto"},
    }


def timeseries(title, description, tgts, unit, x, y, w=12, h=8, stack=False, overrides=(),
               steps=None, min_zero=True):
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
              "spanNulls": False, "axisSoftMin": 0 if min_zero else None,
              "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    if custom["axisSoftMin"] is None:
        del custom["axisSoftMin"]
    defaults = {"unit": unit, "custom": custom, "color": {"mode": "palette-classic"}}
    if steps:
        defaults["thresholds"] = thresholds(*steps)
        custom["thresholdsStyle"] = {"mode": "line+area"}
    return {
        "type": "timeseries", "id": _id(), "title": title, "description": description,
        "datasource": DS, "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": tgts,
        "fieldConfig": {"defaults": defaults, "overrides": list(overrides)},
        "options": {"legend": {"displayMode": "table", "placement": "bottom",
                               "calcs": ["lastNotNull", "max"], "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    }


def red_series(regex, width=3):
    """An override that paints the series whose name matches `regex` red and thick."""
    return {"matcher": {"id": "byRegexp", "options": regex},
            "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
                           {"id": "custom.lineWidth", "value": width},
                           {"id": "custom.fillOpacity", "value": 30}]}


def quantiles(metric, by, legend_prefix, selector="", qs=(0.5, 0.99)):
    sel = "{" + selector + "}" if selector else ""
    group = ", ".join(by + ["le"])
    pairs = []
    for q in qs:
        expr = (f"histogram_quantile({q}, sum by ({group}) "
                f"(rate({metric}_bucket{sel}[{RATE}])))")
        pairs.append((expr, f"{legend_prefix} p{int(q * 100)}".strip()))
    return pairs


def panels():
    p = []
    y = 0
    p.append(row("Overview", y)); y += 1
    p += [
        stat("Segments mounted", "Segments mounted on the master (kvpool_segments_mounted).",
             "sum(kvpool_segments_mounted)", "none", 0, y, [(None, "red"), (1, "green")]),
        stat("Pool capacity", "Sum of the pool sizes of the mounted segments.",
             "sum(kvpool_segment_capacity_bytes)", "bytes", 4, y, [(None, "blue")]),
        stat("Pool used", "Bytes held by objects over capacity, all segments.",
             "sum(kvpool_segment_used_bytes) / sum(kvpool_segment_capacity_bytes)",
             "percentunit", 8, y, [(None, "green"), (0.9, "yellow"), (0.98, "red")], decimals=1),
        stat("Objects", "Committed objects in the index.", "sum(kvpool_objects)", "short",
             12, y, [(None, "blue")]),
        stat("Put pressure", "Keys refused with NO_AVAILABLE_HANDLE per second: no room even "
             "after eviction. Anything above 0 means engines are recomputing prefills.",
             f'sum(rate(kvpool_key_results_total{{code="NO_AVAILABLE_HANDLE"}}[{RATE}])) or vector(0)',
             "ops", 16, y, [(None, "green"), (0.001, "red")], decimals=2),
        stat("Segments died (1h)", "Segments declared dead in the last hour (no heartbeat "
             "within --segment-ttl).", "sum(increase(kvpool_segments_dead_total[1h])) or vector(0)",
             "none", 20, y, [(None, "green"), (1, "red")], decimals=0),
    ]
    y += 4

    p.append(row("Capacity", y)); y += 1
    p += [
        timeseries("Capacity and use per segment", "Pool size and bytes held, per segment.",
                   targets((f"kvpool_segment_capacity_bytes{{{SEG}}}", "{{segment}} capacity"),
                           (f"kvpool_segment_used_bytes{{{SEG}}}", "{{segment}} used")),
                   "bytes", 0, y),
        {
            "type": "bargauge", "id": _id(), "title": "Use per segment",
            "description": "Used over capacity, per segment.", "datasource": DS,
            "gridPos": {"x": 12, "y": y, "w": 6, "h": 8},
            "targets": [target(f"kvpool_segment_used_bytes{{{SEG}}} / "
                               f"kvpool_segment_capacity_bytes{{{SEG}}}", "{{segment}}")],
            "fieldConfig": {"defaults": {
                "unit": "percentunit", "min": 0, "max": 1, "color": {"mode": "thresholds"},
                "thresholds": thresholds((None, "green"), (0.9, "yellow"), (0.98, "red"))},
                "overrides": []},
            "options": {"orientation": "horizontal", "displayMode": "gradient",
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "showUnfilled": True},
        },
        timeseries("Objects", "Committed objects, and objects reserved by BatchPutStart but not "
                   "yet committed or revoked.",
                   targets(("sum(kvpool_objects)", "committed"),
                           ("sum(kvpool_objects_pending)", "pending")),
                   "short", 18, y, w=6),
    ]
    y += 8
    p += [
        timeseries("Busy ranges per segment", "Bytes a segment reports held by late "
                   "shared-memory writes (grant ended while the writer's intent was open); the "
                   "allocator places nothing there until the writer is done or gone.",
                   targets((f"kvpool_segment_busy_bytes{{{SEG}}}", "{{segment}}")),
                   "bytes", 0, y, w=12),
    ]
    y += 8

    p.append(row("Control plane (master gRPC)", y)); y += 1
    p += [
        timeseries("Requests per method", "gRPC calls per second, per method.",
                   targets((f"sum by (method) (rate(kvpool_rpc_requests_total[{RATE}]))",
                            "{{method}}")), "reqps", 0, y, w=8),
        timeseries("Failures per method", "gRPC calls per second that ended with a non-OK "
                   "status (whole-call failures).",
                   targets((f"sum by (method) (rate(kvpool_rpc_failures_total[{RATE}]))",
                            "{{method}}")), "reqps", 8, y, w=8,
                   overrides=[red_series(".*", width=2)]),
        timeseries("Latency per method", "Time the master takes to answer, p50 and p99.",
                   targets(*quantiles("kvpool_rpc_duration_seconds", ["method"], "{{method}}")),
                   "s", 16, y, w=8),
    ]
    y += 8

    p.append(row("Per-key results", y)); y += 1
    p += [
        timeseries("Per-key results by code",
                   "Per-key results of batch calls per second. NO_AVAILABLE_HANDLE (red) is "
                   "pressure: no room even after eviction.",
                   targets((f"sum by (method, code) (rate(kvpool_key_results_total[{RATE}]))",
                            "{{method}} {{code}}")),
                   "ops", 0, y, w=12, stack=True,
                   overrides=[red_series(".*NO_AVAILABLE_HANDLE.*")]),
        timeseries("Put pressure", "Share of the keys of BatchPutStart refused with "
                   "NO_AVAILABLE_HANDLE. The alert KvpoolPutPressure fires above 5%.",
                   targets((f'sum(rate(kvpool_key_results_total{{code="NO_AVAILABLE_HANDLE"}}[{RATE}]))'
                            f" / sum(rate(kvpool_key_results_total{{{PUT_START}}}[{RATE}]))",
                            "NO_AVAILABLE_HANDLE share")),
                   "percentunit", 12, y, w=6, steps=[(None, "green"), (0.05, "red")],
                   overrides=[red_series(".*")]),
        timeseries("Hits and dedup", "Gets: share of keys of BatchGetReplicaList found (OK). "
                   "Puts: share of keys of BatchPutStart already stored (OBJECT_ALREADY_EXISTS, "
                   "nothing written).",
                   targets((f'sum(rate(kvpool_key_results_total{{{GET_LIST},code="OK"}}[{RATE}]))'
                            f" / sum(rate(kvpool_key_results_total{{{GET_LIST}}}[{RATE}]))",
                            "get hit ratio"),
                           (f'sum(rate(kvpool_key_results_total{{{PUT_START},code="OBJECT_ALREADY_EXISTS"}}[{RATE}]))'
                            f" / sum(rate(kvpool_key_results_total{{{PUT_START}}}[{RATE}]))",
                            "put dedup ratio")),
                   "percentunit", 18, y, w=6),
    ]
    y += 8

    p.append(row("Eviction, leases and pins", y)); y += 1
    p += [
        timeseries("Evictions and reclaimed reservations",
                   "Objects evicted per second to make room, and reservations reclaimed because "
                   "their writer never committed (clients dying mid-put).",
                   targets((f"sum(rate(kvpool_evictions_total[{RATE}]))", "objects evicted"),
                           (f"sum(rate(kvpool_reservations_reclaimed_total[{RATE}]))",
                            "reservations reclaimed")),
                   "ops", 0, y, w=8),
        timeseries("Evicted bytes", "Bytes freed by eviction per second.",
                   targets((f"sum(rate(kvpool_evicted_bytes_total[{RATE}]))", "bytes evicted")),
                   "Bps", 8, y, w=8),
        timeseries("Leases and pins", "Read leases held now, and pins by kind. Leased and "
                   "pinned objects cannot be evicted.",
                   targets(("sum(kvpool_leases_active)", "leases"),
                           ("sum by (kind) (kvpool_pins_active)", "pins {{kind}}")),
                   "short", 16, y, w=8),
    ]
    y += 8

    p.append(row("Masters (high availability)", y)); y += 1
    p += [
        timeseries("Leader and term", "Which master leads (1) and the leader's term: the etcd "
                   "revision of its election, a step up at every fail-over (0 without --etcd).",
                   targets(("kvpool_master_is_leader", "leader {{instance}}"),
                           ("max(kvpool_master_term)", "term")),
                   "short", 0, y, w=8),
        timeseries("Fail-overs", "Elections won, and those won after another master had led "
                   "(fail-overs), per hour.",
                   targets(("sum(increase(kvpool_master_elections_total[1h]))", "elections"),
                           ("sum(increase(kvpool_master_failovers_total[1h]))", "fail-overs")),
                   "short", 8, y, w=8),
        timeseries("Fail-over time and etcd", "Of each master's last fail-over: from the last "
                   "sight of the previous leader's key to its own election; and whether each "
                   "master reaches etcd (1).",
                   targets(("kvpool_master_failover_seconds", "fail-over {{instance}}"),
                           ("kvpool_master_etcd_reachable", "etcd reachable {{instance}}")),
                   "short", 16, y, w=8),
    ]
    y += 8

    p.append(row("Data plane (segments)", y)); y += 1
    p += [
        timeseries("Throughput", "Bytes per second read and written, per transport.",
                   targets((f"sum by (op, transport) (rate(kvpool_data_bytes_total{{{INST}}}[{RATE}]))",
                            "{{op}} {{transport}}")), "Bps", 0, y, w=8),
        timeseries("Requests", "Data-plane requests per second, per op and transport.",
                   targets((f"sum by (op, transport) (rate(kvpool_data_requests_total{{{INST}}}[{RATE}]))",
                            "{{op}} {{transport}}")), "reqps", 8, y, w=8),
        timeseries("Latency", "Time to serve one data-plane request, p50 and p99.",
                   targets(*quantiles("kvpool_data_request_duration_seconds", ["op", "transport"],
                                      "{{op}} {{transport}}", selector=INST)),
                   "s", 16, y, w=8),
    ]
    y += 8
    p += [
        timeseries("Rejected requests", "Data-plane requests refused, by segment and reason "
                   "(bad token, out of range, ...).",
                   targets((f"sum by (instance, reason) (rate(kvpool_data_rejected_total{{{INST}}}[{RATE}]))",
                            "{{instance}} {{reason}}")), "reqps", 0, y, w=8,
                   overrides=[red_series(".*", width=2)]),
        {
            "type": "state-timeline", "id": _id(), "title": "Segment mounted",
            "description": "Whether each segment process is mounted on the master.",
            "datasource": DS, "gridPos": {"x": 8, "y": y, "w": 8, "h": 8},
            "targets": [target(f"kvpool_segment_mounted{{{INST}}}", "{{instance}}")],
            "fieldConfig": {"defaults": {
                "color": {"mode": "thresholds"},
                "thresholds": thresholds((None, "red"), (1, "green")),
                "mappings": [{"type": "value", "options": {
                    "0": {"text": "not mounted", "color": "red", "index": 0},
                    "1": {"text": "mounted", "color": "green", "index": 1}}}]},
                "overrides": []},
            "options": {"showValue": "never", "mergeValues": True, "rowHeight": 0.9,
                        "legend": {"showLegend": False}},
        },
        timeseries("Pool size per segment process", "Pool each segment process allocated.",
                   targets((f"kvpool_segment_pool_bytes{{{INST}}}", "{{instance}}")),
                   "bytes", 16, y, w=8),
    ]
    y += 8

    p.append(row("Clients (when engines export the client library's metrics)", y)); y += 1
    p += [
        timeseries("Put latency", "End-to-end put as the client sees it: p50, p90, p99.",
                   targets(*quantiles("kvpool_client_put_duration_seconds", [], "put",
                                      qs=(0.5, 0.9, 0.99))), "s", 0, y, w=8),
        timeseries("Get latency", "End-to-end get as the client sees it: p50, p90, p99.",
                   targets(*quantiles("kvpool_client_get_duration_seconds", [], "get",
                                      qs=(0.5, 0.9, 0.99))), "s", 8, y, w=8),
        timeseries("Client bytes", "Bytes stored and fetched by clients per second.",
                   targets((f"sum by (op) (rate(kvpool_client_bytes_total[{RATE}]))", "{{op}}")),
                   "Bps", 16, y, w=8),
    ]
    y += 8
    p += [
        timeseries("Put phases", "Where a client's puts spend their time: mapping pools, "
                   "reserving, writing, waiting for checksums, committing (p50, p99).",
                   targets(*quantiles("kvpool_client_put_phase_seconds", ["phase"], "{{phase}}")),
                   "s", 0, y, w=12),
    ]
    y += 8

    p.append(row("Security and tenants (docs/operations.md, Security)", y)); y += 1
    p += [
        stat("Authentication", "1 when callers must authenticate (--auth-tokens), and the "
             "rules of the credentials file in force.", "max(kvpool_auth_enabled)", "short",
             0, y, [(None, "red"), (1, "green")], w=3),
        stat("Credential rules", "Rules of the credentials file in force.",
             "max(kvpool_auth_rules)", "short", 3, y, [(None, "blue")], w=3),
        timeseries("Refused calls", "Calls refused per second, by method and reason "
                   "(no_credentials, unknown_token, unknown_certificate: UNAUTHENTICATED; "
                   "wrong_role, other_segment: PERMISSION_DENIED).",
                   targets((f"sum by (method, reason) (rate(kvpool_auth_refusals_total[{RATE}]))",
                            "{{method}} {{reason}}")),
                   "reqps", 6, y, w=6, overrides=[red_series(".*", width=2)]),
        timeseries("Calls per tenant", "Admitted calls per second, per tenant of the caller.",
                   targets((f"sum by (tenant) (rate(kvpool_tenant_calls_total[{RATE}]))",
                            "{{tenant}}")), "reqps", 12, y, w=6),
        timeseries("Tenant bytes and quotas", "Bytes of each tenant's objects (one copy each) "
                   "and its quota (--tenant-quotas).",
                   targets(("sum by (tenant) (kvpool_tenant_used_bytes)", "{{tenant}} used"),
                           ("sum by (tenant) (kvpool_tenant_quota_bytes)", "{{tenant}} quota")),
                   "bytes", 18, y, w=6),
    ]
    return p


def variable(name, label, query):
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "definition": query, "query": {"query": query, "refId": name},
        "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0, "options": [], "regex": "",
    }


def dashboard():
    return {
        "uid": "kvpool-overview",
        "title": "kvpool",
        "description": "kvpool: capacity, control plane, per-key results and pressure, eviction, "
                       "data plane, clients. Generated by deploy/grafana/generate_dashboard.py.",
        "tags": ["kvpool"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "links": [],
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "includeAll": False,
             "multi": False, "options": [], "refresh": 1, "regex": ""},
            variable("segment", "Segment", "label_values(kvpool_segment_capacity_bytes, segment)"),
            variable("instance", "Segment process", "label_values(kvpool_segment_pool_bytes, instance)"),
        ]},
        "panels": panels(),
    }


def render():
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def main():
    text = render()
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        if OUT.read_text() != text:
            print(f"{OUT} is stale: run {pathlib.Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
