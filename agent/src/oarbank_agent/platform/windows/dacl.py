"""Who besides this user may read a file, from its DACL in SDDL (pure: tested everywhere).

Windows has no modes: a file's DACL says who may read it. A secret the agent reads (the
portal token) must be readable by this user alone, and by those who can read anything on the
machine anyway (SYSTEM, the administrators). ``ConvertSecurityDescriptorToStringSecurityDescriptor``
gives the DACL as text, ``D:<flags>(<ace>)(<ace>)...``, each ACE
``type;flags;rights;object;inherited object;sid``.

The reading is conservative: every *allow* ACE that applies to the file itself (not
inherit-only) and grants a read right counts, whatever deny ACE may come before it (a deny
for that same reader would make the refusal needless, never unsafe). A DACL that is absent or
null (``D:NO_ACCESS_CONTROL``) lets everyone in.
"""

from __future__ import annotations

import re

__all__ = ["other_readers", "SID_NAMES"]

# Rights that let a reader see the data: FILE_READ_DATA (0x1, whose SDDL letters are the
# directory service's CC), GENERIC_READ and GENERIC_ALL, MAXIMUM_ALLOWED, and the file and
# key aliases that include them.
_READ_BITS = 0x1 | 0x80000000 | 0x10000000 | 0x02000000
_READ_LETTERS = {"CC", "FA", "FR", "GA", "GR", "KA", "KR"}
# Who may read anything on the machine anyway (SDDL's names and their SIDs), and the owner's
# own alias.
_TRUSTED = {"SY", "S-1-5-18", "BA", "S-1-5-32-544", "OW", "S-1-3-4"}
_INHERIT_ONLY = "IO"
SID_NAMES = {"WD": "Everyone", "S-1-1-0": "Everyone", "BU": "Users", "S-1-5-32-545": "Users",
             "AU": "Authenticated Users", "S-1-5-11": "Authenticated Users",
             "IU": "Interactive users", "AN": "Anonymous", "BG": "Guests", "NU": "Network"}
_ACE = re.compile(r"\(([^()]*)\)")


def _grants_read(rights: str) -> bool:
    if rights.lower().startswith("0x"):
        try:
            return bool(int(rights, 16) & _READ_BITS)
        except ValueError:
            return True  # unreadable: assume the worst
    letters = {rights[i:i + 2] for i in range(0, len(rights), 2)}
    return bool(letters & _READ_LETTERS)


def _dacl_part(sddl: str) -> str | None:
    """The text after ``D:`` up to the SACL (``S:``) or the end; None when there is none."""
    m = re.search(r"D:(.*?)(?:S:\(|S:[A-Z]|$)", sddl)
    return m.group(1) if m else None


def other_readers(sddl: str, own_sid: str) -> list[str]:
    """The readers of the file besides ``own_sid`` and the trusted ones, each named as SDDL
    names it (``WD``, ``BU``, a SID); ``["Everyone"]`` where no DACL guards it."""
    dacl = _dacl_part(sddl)
    if dacl is None or dacl.startswith("NO_ACCESS_CONTROL"):
        return ["Everyone"]
    found: list[str] = []
    for ace in _ACE.findall(dacl):
        fields = ace.split(";")
        if len(fields) < 6:
            found.append(f"an unreadable entry ({ace})")
            continue
        kind, flags, rights, sid = fields[0], fields[1], fields[2], fields[5]
        if kind not in ("A", "OA") or _INHERIT_ONLY in {flags[i:i + 2]
                                                        for i in range(0, len(flags), 2)}:
            continue  # a deny, an audit, or an entry only for what is made inside
        if sid in _TRUSTED or sid == own_sid or not _grants_read(rights):
            continue
        name = SID_NAMES.get(sid, sid)
        if name not in found:
            found.append(name)
    return found
