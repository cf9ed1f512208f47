"""A trained policy's uses outside training: in a PettingZoo loop (``pz_agent``), exported (``export``), played
in the terminal (``play``), watched live (``watch``) or as a GIF (``replay``), and their commands (``cli``). The
Python API they build on is :mod:`rapid.api`."""
