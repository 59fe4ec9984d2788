# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The service's two server slots (blue and green) and the one decision about them: whether a
candidate runs beside the live slot (blue/green) or replaces it in place.

A slot is a unit with its own GPUs and port behind the host's gateway. Blue is the service's
own unit (``<service>.service``: a host deployed before slots existed serves from blue with
nothing moved), green is ``<service>-green.service``. ``current.json`` in the service
directory names the live slot (``slot``, ``unit``); one without them is blue's. The
preflight decides (``decide``) before anything is rendered: the role renders the candidate's
unit for the slot, the port and the GPUs decided here, and the switch (_switch) runs the
decision and checks it again under the deploy lock.

Pure: the caller reads the files, the units and the GPUs (``live_of``'s and ``decide``'s
inputs); nothing here does I/O.
"""

from __future__ import annotations


from ansible_collections.inferops.sglang.plugins.module_utils import _http
from ansible_collections.inferops.sglang.plugins.module_utils._http import url_of

SLOTS = ("blue", "green")
MODES = ("blue_green", "in_place")


class SlotError(Exception):
    """A slot name or a unit name that is not one."""


def other(slot: str) -> str:
    if slot not in SLOTS:
        raise SlotError(f"a slot is one of {', '.join(SLOTS)}, got {slot!r}")
    return SLOTS[1 - SLOTS.index(slot)]


def base_of(service: str) -> str:
    """The service's name without ``.service`` (``sglang.service`` -> ``sglang``)."""
    return service[:-len(".service")] if service.endswith(".service") else service


def unit_of(service: str, slot: str) -> str:
    """The unit of ``slot`` for the service unit ``service`` (``sglang.service``): blue is the service's
    own unit, green ``<base>-green.service``."""
    if slot not in SLOTS:
        raise SlotError(f"a slot is one of {', '.join(SLOTS)}, got {slot!r}")
    base = base_of(service)
    return f"{base}.service" if slot == "blue" else f"{base}-green.service"


def port_of(slot: str, ports: dict) -> int:
    """The slot's server port: ``ports`` {blue: N, green: M}."""
    return int(ports[slot])


def live_of(current: dict | None, service: str, active: bool) -> dict | None:
    """The live slot as current.json records it (None: nothing deployed): slot, unit, variant, URL,
    GPUs and whether its unit is active. A current.json written before slots is blue's."""
    if not isinstance(current, dict) or not current.get("variant"):
        return None
    slot = current.get("slot") if current.get("slot") in SLOTS else "blue"
    unit = current.get("unit") or unit_of(service, slot)
    gpus = current.get("gpu_devices")
    return {"slot": slot, "unit": unit, "variant": current["variant"], "url": url_of(current.get("argv")),
            "gpus": [g for g in gpus if isinstance(g, int)] if isinstance(gpus, list) else [], "active": bool(active),
            "params": current.get("params") if isinstance(current.get("params"), dict) else None}


def decide(live: dict | None, params: dict | None, tp_size: int, pool: list[int], given: list[int] | None,
           busy: dict[int, int], threshold_mib: int, check_gpus: bool, service: str, ports: dict,
           marker: dict | None = None) -> dict:
    """Where the candidate runs: ``mode`` blue_green (the free slot, beside the live one) or
    in_place (the live slot, or blue on a host's first deploy), ``slot``, ``unit``, ``port``,
    ``gpus`` (None in place: the deploy's own), ``live`` (as ``live_of`` read it), ``why`` and
    ``service`` (the service's own unit, blue's: what its metrics and records are named by).

    ``pool``: the GPUs provisioning found usable (the host manifest's, in its order); ``given``:
    the GPUs the inventory named, if it did; ``busy``: MiB in use now per GPU (nvidia-smi);
    a GPU holding ``threshold_mib`` or more runs something else and is not free. Blue/green
    needs a live slot that runs another variant (``params``, the variant's resolved parameters,
    differ from the live one's: the same variant again is the live slot's, in place, where an
    unchanged service stays unchanged) and ``tp_size`` GPUs it does not use, each free; without
    check_gpus (a host with no GPUs to read) the candidate is given the same devices as the
    deploy, and the decision says that nothing was checked. ``marker``: the switch marker an
    interrupted switch left; an in-place one is repaired in place."""
    def in_place(why: str) -> dict:
        slot = live["slot"] if live else "blue"
        # the live slot keeps its GPUs when they are as many as the TP size, else the deploy's own
        keep = live is not None and len(live["gpus"]) == tp_size and (given is None or sorted(given) == sorted(live["gpus"]))
        return {"mode": "in_place", "slot": slot, "unit": unit_of(service, slot), "port": port_of(slot, ports),
                "gpus": list(live["gpus"]) if keep else None, "live": live, "why": why, "service": service}

    if live is None:
        return in_place("nothing is deployed yet: the first deploy starts the blue slot in place")
    if marker is not None and marker.get("mode") != "blue_green":
        return in_place(f"an interrupted in-place switch (state {marker.get('state')}) is repaired in place")
    live_port = _http.port_of(live["url"])
    if live_port != ports[live["slot"]]:
        return in_place(f"{live['variant']} listens on {live['url']}, not on slot {live['slot']}'s port "
                        f"{ports[live['slot']]}: it moves there (behind the gateway) in place first")
    if not live["active"]:
        return in_place(f"the live slot {live['slot']} ({live['unit']}) is not running: "
                        "nothing serves that a candidate could run beside, so it is replaced in place")
    if params is not None and live.get("params") == params:
        return in_place(f"{live['variant']} already runs in slot {live['slot']} with these parameters: its own slot "
                        "is checked (and switched in place if its files changed)")
    slot = other(live["slot"])

    def beside(gpus: list[int], why: str) -> dict:
        return {"mode": "blue_green", "slot": slot, "unit": unit_of(service, slot), "port": port_of(slot, ports),
                "gpus": list(gpus), "live": live, "why": why, "service": service}

    if not check_gpus:
        devices = list(given if given is not None else live["gpus"])
        return beside(devices, f"beside {live['variant']} in slot {live['slot']}; check_gpus is false: the GPUs "
                               f"({devices}) are neither read nor shared out")
    held = set(live["gpus"])
    if marker is not None:
        # a blue/green switch cut short: the switch stops the slot it left over before it starts anything,
        # so the GPUs of either of its slots that are not the live one's are free for this decision
        leftover = {g for g in [*(marker.get("gpus") or []), *(marker.get("live_gpus") or [])] if isinstance(g, int)}
        busy = {g: 0 if g in leftover else mib for g, mib in busy.items()}
    candidates = list(given if given is not None else pool)
    overlap = [g for g in candidates if g in held]
    if given is not None and overlap:
        return in_place(f"the GPUs given (sglang_service_gpu_devices {given}) include {overlap}, which the live slot "
                        f"{live['slot']} uses")
    free = [g for g in candidates if g not in held and busy.get(g, 0) < threshold_mib]
    taken = [g for g in candidates if g not in held and busy.get(g, 0) >= threshold_mib]
    if len(free) < tp_size:
        detail = f"; {', '.join(f'GPU {g} holds {busy[g]} MiB' for g in taken)}" if taken else ""
        return in_place(f"TP {tp_size} needs {tp_size} free GPUs beside the live slot {live['slot']} (GPUs "
                        f"{sorted(held)}); the usable ones it does not use are {[g for g in candidates if g not in held]}, "
                        f"free: {free}{detail}")
    gpus = free[:tp_size]
    return beside(gpus, f"beside {live['variant']} in slot {live['slot']} (GPUs {sorted(held)}), on free GPUs {gpus}")


TRIAL_ROLES = ("reference", "candidate")


def trial_unit(service: str, role: str) -> str:
    """The unit a tune runs ``role`` (reference or candidate) in: ``<base>-tune-<role>.service``."""
    if role not in TRIAL_ROLES:
        raise SlotError(f"a trial role is one of {', '.join(TRIAL_ROLES)}, got {role!r}")
    return f"{base_of(service)}-tune-{role}.service"


def trial_groups(live: dict | None, tp_size: int, pool: list[int], busy: dict[int, int], threshold_mib: int,
                 check_gpus: bool, own: list[int], in_place: bool = False) -> dict:
    """Where a tune's trial servers run: ``groups`` (reference's GPUs, candidate's GPUs), ``mode`` and
    ``why``, or ``groups`` None with ``why``. Each group is ``tp_size`` of the ``pool``'s GPUs that the
    live slot does not use, each holding less than ``threshold_mib`` now (as ``decide`` reads them).
    Modes: ``two`` (two free groups: the reference and a candidate serve at once, beside the live
    service); ``one`` (one free group: they take turns in it, beside the live service); ``in_place``
    (no free group and the operator allowed it: they take turns on the live slot's GPUs, the live
    service stopped for the tune). Without check_gpus both get the deploy's own devices (``own``) at
    once, and the answer says that nothing was checked."""
    held = set(live["gpus"]) if live and live.get("active") else set()
    devices = list(pool)
    if not check_gpus:
        own = list(own)
        return {"groups": [own, own], "mode": "two",
                "why": f"check_gpus is false: both trial servers get the devices {own}, neither read nor shared out"}
    free = [g for g in devices if g not in held and busy.get(g, 0) < threshold_mib]
    beside = f" beside the live slot (GPUs {sorted(held)})" if held else ""
    if tp_size >= 1 and len(free) >= 2 * tp_size:
        return {"groups": [free[:tp_size], free[tp_size:2 * tp_size]], "mode": "two",
                "why": f"reference on GPUs {free[:tp_size]}, candidates on GPUs {free[tp_size:2 * tp_size]}" + beside
                       + ", serving at once"}
    if tp_size >= 1 and len(free) >= tp_size:
        return {"groups": [free[:tp_size], free[:tp_size]], "mode": "one",
                "why": f"one free group of TP {tp_size}: the reference and each candidate take turns on GPUs "
                       f"{free[:tp_size]}" + beside + " (the reference measured before and after the candidates)"}
    taken = [g for g in devices if g not in held and busy.get(g, 0) >= threshold_mib]
    detail = f"; {', '.join(f'GPU {g} holds {busy[g]} MiB' for g in taken)}" if taken else ""
    room = f"TP {tp_size} needs {tp_size} free GPUs{beside}; the usable ones are {devices}, free: {free}{detail}"
    if not in_place:
        return {"groups": None, "why": room + "; a tune in place (tune_in_place) would stop the live service for the tune "
                                              "and run the trials on its GPUs"}
    if len(held) < max(1, tp_size):
        return {"groups": None, "why": room + (f"; in place, the live slot's GPUs {sorted(held)} are fewer than TP {tp_size}"
                                               if held else "; in place of nothing: no live slot is serving")}
    group = [g for g in live["gpus"] if g in held][:tp_size]
    return {"groups": [group, group], "mode": "in_place",
            "why": f"no free GPU group ({room}): the trials take turns in place of the live service on GPUs {group}, "
                   "which is stopped for the tune and restored and proven at its end"}
