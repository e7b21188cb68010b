// Unit tests of the labextension's pure functions (test/*.spec.ts), compiled by ts-jest with
// tsconfig.test.json (CommonJS); no JupyterLab and no DOM: the modules under test import none.
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/test'],
  transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }] }
};
