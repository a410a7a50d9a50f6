"""Pure functions of Snapshots: verdicts, diff, advice.  Never imports the live side."""
