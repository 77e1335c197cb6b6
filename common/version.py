"""The one version string every part reports (agents in GetHostInfo, `holdfast version`)."""

VERSION = "0.1.0"
