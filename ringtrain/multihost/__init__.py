"""Running across hosts: hostfiles, ports, process trees started locally or
over ssh, and a simulated cluster of network-namespace hosts on one machine.
Used by the PS launcher, the bench and the tests; knows nothing of training."""
