"""Upgrades from earlier releases, tested against ledgers those releases made themselves."""
