"""The package version: in every manifest key and bundle index, so it lives below everything."""

__version__ = "0.1.0"
