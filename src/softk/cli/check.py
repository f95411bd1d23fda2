"""`softk check` (placeholder until its issue lands)."""


def register(sub):
    p = sub.add_parser("check", help="(not implemented yet)")
    p.set_defaults(run=lambda args: print("softk check: not implemented yet") or 0)
