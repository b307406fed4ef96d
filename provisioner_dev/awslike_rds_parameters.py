"""DB parameter groups in the aws-like cloud: what AWS shows that moto does not.

moto keeps a group's existence and tags, and stores any parameter it is given. AWS knows the
parameters of each family, each with its ApplyType: DescribeDBParameters lists them all
(Source `engine-default` or `user`), ModifyDBParameterGroup refuses a name the family lacks
and ApplyMethod `immediate` for a static parameter, ResetDBParameterGroup puts a parameter
back to its default. An instance's group shows ParameterApplyStatus `pending-reboot` after a
static change (or after it was given another group) until RebootDBInstance, which shows
`rebooting` for a while. DescribeDBEngineVersions with DefaultOnly names the default version
and its family. The parameters below are a few of each family's, with AWS's ApplyType
(https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/Appendix.PostgreSQL.CommonDBATasks.Parameters.html,
https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/USER_WorkingWithParamGroups.html).
"""

from __future__ import annotations

import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from aiohttp import web

from provisioner_dev.awslike_http import RDS_NS, Answer, Call, plain, request_id

POSTGRES = {
    "work_mem": ("4096", "dynamic"),
    "log_min_duration_statement": ("-1", "dynamic"),
    "statement_timeout": ("0", "dynamic"),
    "rds.force_ssl": ("1", "dynamic"),
    "max_connections": ("100", "static"),
    "shared_buffers": ("16384", "static"),
    "shared_preload_libraries": ("pg_stat_statements", "static"),
}
MYSQL = {
    "max_connections": ("150", "dynamic"),
    "long_query_time": ("10", "dynamic"),
    "slow_query_log": ("0", "dynamic"),
    "character_set_server": ("utf8mb4", "dynamic"),
    "innodb_buffer_pool_size": ("134217728", "static"),
    "innodb_log_file_size": ("134217728", "static"),
}
# DescribeDBEngineVersions DefaultOnly: engine -> (version, family).
DEFAULTS = {
    "postgres": ("16.3", "postgres16"),
    "mysql": ("8.0.35", "mysql8.0"),
    "mariadb": ("10.11.6", "mariadb10.11"),
}
ACTIONS = (
    "CreateDBParameterGroup",
    "ModifyDBParameterGroup",
    "ResetDBParameterGroup",
    "DescribeDBParameters",
    "DescribeDBEngineVersions",
)

Key = tuple[str, str, str]


def catalogue(family: str) -> dict[str, tuple[str, str]]:
    return POSTGRES if family.startswith("postgres") else MYSQL


@dataclass
class Group:
    family: str
    values: dict[str, str] = field(default_factory=dict)
    static_changed: float = -1.0


@dataclass
class Boots:
    """When an instance last booted, and when it was given another group."""

    booted: float = 0.0
    attached: float = -1.0


class Parameters:
    def __init__(self) -> None:
        self.groups: dict[Key, Group] = {}
        self.boots: dict[Key, Boots] = {}

    def apply_status(self, account: str, region: str, ident: str, group: str) -> str:
        found = self.groups.get((account, region, group))
        boots = self.boots.get((account, region, ident), Boots())
        changed = max(found.static_changed if found else -1.0, boots.attached)
        return "pending-reboot" if changed > boots.booted else "in-sync"

    def booted(self, key: Key, at: float) -> None:
        self.boots.setdefault(key, Boots()).booted = at

    def attached(self, key: Key, at: float) -> None:
        self.boots.setdefault(key, Boots()).attached = at


def _params(call: Call) -> dict[str, str]:
    text = call.body.decode(errors="replace")
    return {k: v[0] for k, v in urllib.parse.parse_qs(text).items()}


def _listed(params: dict[str, str]) -> list[dict[str, str]]:
    """Parameters.Parameter.N.X (or Parameters.member.N.X) as dicts, in N order."""
    found: dict[int, dict[str, str]] = {}
    for key, value in params.items():
        parts = key.split(".")
        if len(parts) == 4 and parts[0] == "Parameters" and parts[2].isdigit():
            found.setdefault(int(parts[2]), {})[parts[3]] = value
    return [found[n] for n in sorted(found)]


def _answer(action: str, result: ET.Element | None = None) -> web.Response:
    root = ET.Element(f"{{{RDS_NS}}}{action}Response")
    if result is not None:
        root.append(result)
    meta = ET.SubElement(root, f"{{{RDS_NS}}}ResponseMetadata")
    ET.SubElement(meta, f"{{{RDS_NS}}}RequestId").text = request_id()
    return web.Response(
        status=200, body=ET.tostring(root, encoding="unicode"), content_type="text/xml"
    )


def _sub(parent: ET.Element, tag: str, text: str | None = None) -> ET.Element:
    element = ET.SubElement(parent, f"{{{RDS_NS}}}{tag}")
    if text is not None:
        element.text = text
    return element


async def handle_parameters(model: Parameters, call: Call) -> web.StreamResponse:
    params = _params(call)
    if call.action == "DescribeDBEngineVersions":
        return _engine_versions(params)
    name = params.get("DBParameterGroupName", "").lower()
    key = (call.account, call.region, name)
    if call.action == "ModifyDBParameterGroup":
        refused = _refusal(model, call, key, _listed(params))
        if refused is not None:
            return refused
    # moto answers for the group's existence (DBParameterGroupNotFound), and keeps it.
    if call.action == "ResetDBParameterGroup":
        answer = await _probe(call, name)
    else:
        answer = await call.forward()
    if answer.status != 200:
        return plain(answer)
    now = call.clock()
    if call.action == "CreateDBParameterGroup":
        model.groups[key] = Group(family=params.get("DBParameterGroupFamily", ""))
        return plain(answer)
    group = model.groups.setdefault(key, Group(family=""))
    if call.action == "ModifyDBParameterGroup":
        types = catalogue(group.family)
        for entry in _listed(params):
            group.values[entry["ParameterName"]] = entry.get("ParameterValue", "")
            if types[entry["ParameterName"]][1] == "static":
                group.static_changed = now
        return plain(answer)
    if call.action == "ResetDBParameterGroup":
        return _reset(group, params, name, now)
    return _describe(group, params)


async def _probe(call: Call, name: str) -> Answer:
    """moto's DescribeDBParameters of the group: DBParameterGroupNotFound when it has none."""
    body = urllib.parse.urlencode(
        {"Action": "DescribeDBParameters", "Version": "2014-10-31", "DBParameterGroupName": name}
    ).encode()
    headers = {
        "Authorization": call.request.headers.get("Authorization", ""),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    return await call.upstream.send("POST", "/", headers, body)


def _refusal(
    model: Parameters, call: Call, key: Key, entries: list[dict[str, str]]
) -> web.Response | None:
    group = model.groups.get(key)
    types = catalogue(group.family if group else "")
    for entry in entries:
        name = entry.get("ParameterName", "")
        if name not in types:
            return call.refuse(
                "rds",
                call.action,
                "query",
                400,
                "InvalidParameterValue",
                f"Could not find parameter with name: {name}",
            )
        if types[name][1] == "static" and entry.get("ApplyMethod") == "immediate":
            return call.refuse(
                "rds",
                call.action,
                "query",
                400,
                "InvalidParameterCombination",
                f"cannot use immediate apply method for static parameter {name}",
            )
    return None


def _reset(group: Group, params: dict[str, str], name: str, now: float) -> web.Response:
    types = catalogue(group.family)
    if params.get("ResetAllParameters", "").lower() == "true":
        names = list(group.values)
    else:
        names = [e.get("ParameterName", "") for e in _listed(params)]
    for parameter in names:
        if (
            group.values.pop(parameter, None) is not None
            and types.get(parameter, ("", ""))[1] == "static"
        ):
            group.static_changed = now
    result = ET.Element(f"{{{RDS_NS}}}ResetDBParameterGroupResult")
    _sub(result, "DBParameterGroupName", name)
    return _answer("ResetDBParameterGroup", result)


def _describe(group: Group, params: dict[str, str]) -> web.Response:
    source = params.get("Source", "")
    result = ET.Element(f"{{{RDS_NS}}}DescribeDBParametersResult")
    listing = _sub(result, "Parameters")
    for name, (default, apply_type) in sorted(catalogue(group.family).items()):
        user = name in group.values
        if source and source != ("user" if user else "engine-default"):
            continue
        entry = _sub(listing, "Parameter")
        _sub(entry, "ParameterName", name)
        _sub(entry, "ParameterValue", group.values[name] if user else default)
        _sub(entry, "Source", "user" if user else "engine-default")
        _sub(entry, "ApplyType", apply_type)
        _sub(entry, "DataType", "string")
        _sub(entry, "IsModifiable", "true")
    return _answer("DescribeDBParameters", result)


def _engine_versions(params: dict[str, str]) -> web.Response:
    engine = params.get("Engine", "")
    result = ET.Element(f"{{{RDS_NS}}}DescribeDBEngineVersionsResult")
    listing = _sub(result, "DBEngineVersions")
    if engine in DEFAULTS:
        version, family = DEFAULTS[engine]
        entry = _sub(listing, "DBEngineVersion")
        _sub(entry, "Engine", engine)
        _sub(entry, "EngineVersion", version)
        _sub(entry, "DBParameterGroupFamily", family)
    return _answer("DescribeDBEngineVersions", result)


def render_groups(model: Parameters, element: ET.Element, account: str, region: str) -> None:
    """An instance's DBParameterGroups with the apply status AWS would show now."""
    ident = element.findtext(f"{{{RDS_NS}}}DBInstanceIdentifier") or ""
    for group in element.iter(f"{{{RDS_NS}}}DBParameterGroup"):
        name = (group.findtext(f"{{{RDS_NS}}}DBParameterGroupName") or "").lower()
        status = group.find(f"{{{RDS_NS}}}ParameterApplyStatus")
        if status is not None:
            status.text = model.apply_status(account, region, ident, name)
