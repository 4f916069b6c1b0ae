#!/bin/sh
# horovodrun --host-discovery-script for `ringtrain --elastic`: prints the hosts
# that are up now, one `host:slots` per line, from the file named by
# RINGTRAIN_ELASTIC_HOSTS (default: ./elastic-hosts). Edit that file while the
# job runs: a line removed takes that host out at the next commit, a line added
# brings it in.
exec cat "${RINGTRAIN_ELASTIC_HOSTS:-elastic-hosts}"
